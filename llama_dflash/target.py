"""The target model's context: batched decodes, logits rows and layer-input features."""

from __future__ import annotations

import ctypes
import math
import os
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from . import _bindings as ext
from ._batch import TokenBatch, logits_addr, logits_ith_addr
from ._llama import Context, Model
from .config import TargetConfig
from .errors import LlamaCallError

__all__ = ["TargetContext", "default_threads", "float_view", "FLASH_ATTN_TYPES"]

#: TargetConfig.flash_attn -> llama.cpp's llama_flash_attn_type
FLASH_ATTN_TYPES = {
    "auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}

_views: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}


def float_view(ptr: "int | ctypes._Pointer[ctypes.c_float]", shape: tuple[int, ...]) -> np.ndarray:
    """A zero-copy numpy view of `shape` floats at an address (an int, or a ctypes pointer)
    llama.cpp just returned.

    np.ctypeslib.as_array costs ~15 us a call, several times per step; llama.cpp hands out the
    same few addresses (its output buffers) again and again, so views are kept per address.
    """
    addr = ptr if isinstance(ptr, int) else ctypes.cast(ptr, ctypes.c_void_p).value
    key = (addr, shape)
    view = _views.get(key)
    if view is None:
        if len(_views) > 256:
            _views.clear()
        view = np.frombuffer((ctypes.c_float * math.prod(shape)).from_address(addr), dtype=np.float32)
        view = view.reshape(shape)
        _views[key] = view
    return view


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


class TargetContext:
    """One sequence (seq_id 0) on a target model, with optional layer-input extraction.

    Owns its context and batch; shares the Model with whoever passed it in.
    """

    def __init__(
        self,
        model: Model,
        config: TargetConfig,
        extract_layers: Sequence[int] = (),
        n_rs_seq: int = 0,
        n_outputs_max_per_seq: int = 0,
        ctx: Optional[Context] = None,
    ):
        """`ctx`: drive an existing context (a llama_cpp.Llama's) instead of creating one."""
        self.model = model
        self.config = config
        if ctx is None:
            params = ll.llama_context_default_params()
            params.n_ctx = config.n_ctx
            params.n_batch = config.n_batch
            params.n_ubatch = config.n_ubatch
            params.n_seq_max = 1
            params.n_rs_seq = n_rs_seq
            params.n_outputs_max_per_seq = n_outputs_max_per_seq
            threads = config.n_threads or default_threads()
            params.n_threads = threads
            params.n_threads_batch = threads
            params.flash_attn_type = FLASH_ATTN_TYPES[config.flash_attn]
            params.no_perf = True
            ctx = Context(model, params)
        self.ctx = ctx
        self.batch = TokenBatch(self.ctx.n_batch)
        self.n_vocab = model.n_vocab
        self.n_embd = model.n_embd
        self.extract_layers = tuple(int(x) for x in extract_layers)
        for lid in self.extract_layers:
            ext.llama_set_embeddings_layer_inp(self.ctx.ptr, lid, True)
        self._layer_inp = ext.llama_get_embeddings_layer_inp_addr.resolve()
        self._n_rows = 0  # rows of the last decode

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def closed(self) -> bool:
        return self.ctx.closed

    def draft_context_params(self, n_threads: Optional[int] = None) -> "ll.llama_context_params":
        """The parameters of a one-sequence draft context beside this target (a classic draft, an
        EAGLE-3 head, the MTP head): the target's context size, batch sizes and flash attention, and
        `n_threads` (default: the target's)."""
        params = ll.llama_context_default_params()
        params.n_ctx = self.n_ctx
        params.n_batch = self.ctx.n_batch
        params.n_ubatch = self.ctx.n_ubatch
        params.n_seq_max = 1
        threads = n_threads or self.config.n_threads or default_threads()
        params.n_threads = threads
        params.n_threads_batch = threads
        params.flash_attn_type = FLASH_ATTN_TYPES[self.config.flash_attn]
        params.no_perf = True
        return params

    def close(self) -> None:
        self.ctx.close()

    # ---- decoding ---------------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], pos0: int, logits: str = "last") -> None:
        """Decode `tokens` at positions pos0.. in one llama_decode call (see `_batch`).

        logits: "none", "last" or "all" rows.  Raises LlamaCallError if llama.cpp refuses.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("decode needs at least one token")
        if n > self.ctx.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch {self.ctx.n_batch}")
        self.batch.set(tokens, pos0, logits)
        rc = self.batch.decode(self.ctx.ptr)
        if rc != 0:
            raise LlamaCallError(f"target decode of {n} tokens at position {pos0} failed (llama_decode returned {rc})")
        self._n_rows = n

    def logits_rows(self, n: int) -> np.ndarray:
        """A zero-copy [n, n_vocab] view of the first n output rows of the last decode."""
        ptr = logits_addr(self.ctx.ptr)
        if not ptr:
            raise LlamaCallError("the last decode produced no logits")
        return float_view(ptr, (n, self.n_vocab))

    def logits_row(self, i: int) -> np.ndarray:
        """A zero-copy view of the logits of batch row i of the last decode."""
        ptr = logits_ith_addr(self.ctx.ptr, i)
        if not ptr:
            raise LlamaCallError(f"no logits for batch row {i}")
        return float_view(ptr, (self.n_vocab,))

    def layer_features(self, n_rows: int | None = None) -> np.ndarray:
        """Inputs of the extracted layers for the first n_rows (default all) rows of the last
        decode: a new [rows, n_layers*n_embd] float32 array."""
        n, e = self._n_rows if n_rows is None else min(n_rows, self._n_rows), self.n_embd
        out = np.empty((n, len(self.extract_layers) * e), dtype=np.float32)
        ctx, layer_inp, shape = self.ctx.ptr, self._layer_inp, (n, e)
        for k, lid in enumerate(self.extract_layers):
            ptr = layer_inp(ctx, lid)
            if not ptr:
                raise LlamaCallError(f"target layer {lid} input was not extracted")
            out[:, k * e : (k + 1) * e] = float_view(ptr, shape)
        return out

    def seq_rm(self, p0: int) -> bool:
        return self.ctx.seq_rm(0, p0, -1)

    def pos_max(self) -> int:
        return self.ctx.pos_max(0)

    def clear(self) -> None:
        self.ctx.clear()

