"""Bringing the target's cache back to the accepted prefix after a rejected draft.

Attention KV caches drop cells beyond a position (`llama_memory_seq_rm`).  A recurrent state
(Mamba-style conv/SSM layers of recurrent and hybrid models) summarises every token seen and
cannot be cut at a position, so two other strategies exist:

* native: the context is created with `n_rs_seq >= draft length`; llama.cpp then keeps the
  state after each of the last n_rs_seq tokens of a decode, and `seq_rm` picks one of them.
  Only some architectures honour it, and it is single-use: one rollback between two decodes.
  So the rollback is deferred until just before the next decode (or the end of the
  generation), when the final position is known.
* checkpoint: before each verification the sequence's recurrent state is copied
  (`llama_state_seq_get_data_ext` with PARTIAL_ONLY; kept on the device when llama.cpp can);
  after a rejection it is restored, the attention cells beyond the step are dropped, and the
  accepted tokens are decoded again so the cache ends exactly where ordinary decoding would.

`make_rewinder` picks the strategy for a target; tests can force one.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Optional, Sequence

from llama_cpp import llama_cpp as ll

from .config import ROLLBACK_MODES
from ._llama import Model
from .errors import LlamaCallError
from .stats import SpecStats
from .target import TargetContext

__all__ = [
    "ROLLBACK_MODES", "Rewinder", "NativeRewinder", "CheckpointRewinder",
    "make_rewinder", "is_recurrent_model", "native_depth_needed",
]

_PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
_ON_DEVICE = 2  # LLAMA_STATE_SEQ_FLAGS_ON_DEVICE


def is_recurrent_model(model: Model) -> bool:
    """True for recurrent and hybrid models: their caches cannot be cut at a position."""
    return bool(ll.llama_model_is_recurrent(model.ptr) or ll.llama_model_is_hybrid(model.ptr))


def native_depth_needed(n_max: int) -> int:
    """Snapshots a native rollback needs: a verification decodes n_max + 1 tokens, of which at
    most n_max are rejected."""
    return n_max


class Rewinder:
    """Attention-only targets: the cache is cut directly.

    Protocol used by the generation loop: `before_verify(pos0, tokens)` right before a target
    decode of `tokens` at pos0.., `rewind(n_keep)` whenever fewer positions must stay, and
    `settle()` at the end of a generation; `rewind` returns the positions actually kept (a
    strategy that cannot go back that far empties the cache and returns 0).
    """

    mode = "kv"

    def __init__(self, target: TargetContext, stats: SpecStats):
        self.target = target
        self.stats = stats

    def before_verify(self, pos0: int, tokens: Sequence[int]) -> None:
        pass

    def rewind(self, n_keep: int) -> int:
        if not self.target.seq_rm(n_keep):
            raise LlamaCallError(f"llama_memory_seq_rm failed on the target at position {n_keep}")
        return n_keep

    def settle(self) -> None:
        pass

    def reset(self) -> None:
        """A new generation: the caller cleared the cache."""

    @property
    def bytes_held(self) -> int:
        return 0

    def close(self) -> None:
        pass


class NativeRewinder(Rewinder):
    """llama.cpp's per-token recurrent snapshots (`n_rs_seq`): one deferred rollback per decode."""

    mode = "native"

    def __init__(self, target: TargetContext, stats: SpecStats):
        super().__init__(target, stats)
        self.depth = int(ll.llama_n_rs_seq(target.ctx.ptr))
        self._pending: Optional[int] = None
        self._pos0 = 0  # first position of the last decode
        self._decoded_end = 0  # one past its last position

    def before_verify(self, pos0: int, tokens: Sequence[int]) -> None:
        self.settle()
        self._pos0, self._decoded_end = pos0, pos0 + len(tokens)

    def rewind(self, n_keep: int) -> int:
        if n_keep >= self._decoded_end:
            return n_keep
        # the snapshots hold the states after each of the last decode's tokens, not before it
        if n_keep <= self._pos0 or self._decoded_end - n_keep > self.depth:
            self.target.clear()
            self._pending, self._pos0, self._decoded_end = None, 0, 0
            return 0
        self._pending = n_keep if self._pending is None else min(self._pending, n_keep)
        return n_keep

    def settle(self) -> None:
        if self._pending is None:
            return
        n_keep, self._pending = self._pending, None
        t0 = time.perf_counter()
        if not self.target.seq_rm(n_keep):
            raise LlamaCallError(f"native recurrent rollback to position {n_keep} was refused by llama.cpp")
        self._decoded_end = n_keep
        self.stats.native_rollbacks += 1
        self.stats.native_rollback_seconds += time.perf_counter() - t0

    def reset(self) -> None:
        self._pending, self._pos0, self._decoded_end = None, 0, 0


class CheckpointRewinder(Rewinder):
    """Copy the recurrent state before verifying; restore it and replay the accepted tokens."""

    mode = "checkpoint"

    def __init__(self, target: TargetContext, stats: SpecStats, *, on_device: bool = True):
        super().__init__(target, stats)
        self._flags = _PARTIAL_ONLY | (_ON_DEVICE if on_device else 0)
        self._buf: Optional[ctypes.Array] = None
        self._size = 0  # bytes of the current checkpoint in _buf
        self._state_bytes = 0  # bytes of recurrent state the checkpoint holds (host or device)
        self._pos0 = -1  # the checkpoint is the state of positions < _pos0
        self._tokens: list[int] = []
        self._decoded_end = 0

    @property
    def on_device(self) -> bool:
        return bool(self._flags & _ON_DEVICE)

    @property
    def bytes_held(self) -> int:
        return self._state_bytes

    def before_verify(self, pos0: int, tokens: Sequence[int]) -> None:
        self._decoded_end = pos0 + len(tokens)
        if len(tokens) <= 1:
            # nothing drafted: a rejection cannot happen, only an early stop (handled by clearing)
            self._pos0 = -1
            return
        t0 = time.perf_counter()
        self._capture()
        self._pos0, self._tokens = pos0, list(tokens)
        self.stats.checkpoint_captures += 1
        self.stats.checkpoint_capture_seconds += time.perf_counter() - t0

    def _capture(self) -> None:
        ctx = self.target.ctx.ptr
        size = ll.llama_state_seq_get_size_ext(ctx, 0, self._flags)
        if size == 0 and self.on_device:
            self._fall_back_to_host("llama.cpp reports no on-device state size")
            return self._capture()
        if self._buf is None or len(self._buf) < size:
            self._buf = (ctypes.c_uint8 * size)()
        got = ll.llama_state_seq_get_data_ext(ctx, self._buf, size, 0, self._flags)
        if got == 0:
            if self.on_device:
                self._fall_back_to_host("llama.cpp could not keep the state on the device")
                return self._capture()
            raise LlamaCallError("llama_state_seq_get_data_ext could not checkpoint the target state")
        self._size = got
        if self.on_device:
            self._state_bytes = max(self._state_bytes, ll.llama_state_seq_get_size_ext(ctx, 0, _PARTIAL_ONLY))
        else:
            self._state_bytes = len(self._buf)
        self.stats.checkpoint_bytes = self._state_bytes
        self.stats.checkpoint_on_device = self.on_device

    def _fall_back_to_host(self, reason: str) -> None:
        logging.getLogger("llama_dflash").info("checkpoints kept in host memory: %s", reason)
        self._flags &= ~_ON_DEVICE

    def rewind(self, n_keep: int) -> int:
        if n_keep >= self._decoded_end:
            return n_keep
        if self._pos0 < 0 or n_keep < self._pos0:
            # no checkpoint covers this position: start over with empty caches
            self.target.clear()
            self._pos0, self._decoded_end = -1, 0
            return 0
        t0 = time.perf_counter()
        ctx = self.target.ctx.ptr
        if ll.llama_state_seq_set_data_ext(ctx, self._buf, self._size, 0, self._flags) == 0:
            raise LlamaCallError("llama_state_seq_set_data_ext could not restore the target checkpoint")
        if not self.target.seq_rm(self._pos0):
            raise LlamaCallError(f"llama_memory_seq_rm failed on the target at position {self._pos0}")
        t1 = time.perf_counter()
        replay = self._tokens[: n_keep - self._pos0]
        if replay:
            self.target.decode(replay, self._pos0, logits="none")
        self._decoded_end = n_keep
        s = self.stats
        s.checkpoint_restores += 1
        s.checkpoint_restore_seconds += t1 - t0
        s.replay_seconds += time.perf_counter() - t1
        s.replayed_tokens += len(replay)
        return n_keep

    def reset(self) -> None:
        self._pos0, self._decoded_end = -1, 0

    def close(self) -> None:
        self._buf = None


def make_rewinder(target: TargetContext, stats: SpecStats, mode: str = "auto") -> Rewinder:
    """The strategy for this target context.  `mode`: "auto" (native where llama.cpp honours
    n_rs_seq, else checkpoint; plain cuts for attention-only targets), "native" or "checkpoint"."""
    if mode not in ROLLBACK_MODES:
        raise ValueError(f"rollback must be one of {', '.join(ROLLBACK_MODES)}, not {mode!r}")
    if not is_recurrent_model(target.model):
        if mode != "auto":
            raise ValueError(f"rollback={mode!r} applies to recurrent or hybrid targets only; "
                             "this target's cache is attention-only")
        return Rewinder(target, stats)
    has_native = ll.llama_n_rs_seq(target.ctx.ptr) > 0
    if mode == "native" and not has_native:
        raise ValueError("rollback='native' needs an architecture that honours n_rs_seq "
                         "(recurrent snapshot rollback); use 'checkpoint' or 'auto'")
    if mode == "native" or (mode == "auto" and has_native):
        return NativeRewinder(target, stats)
    return CheckpointRewinder(target, stats)
