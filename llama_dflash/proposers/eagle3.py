"""`Eagle3Proposer`: an EAGLE-3 head (llama.cpp's `draft-eagle3`).

The head (architecture ``eagle3``, `src/models/eagle3.cpp`) has two graphs in one context:

* an encoder: ``g = fc(concat of the target's inputs of three layers)`` for each target row
  (`llama_process` with LLAMA_PROCESS_TYPE_ENCODE, read with `llama_get_embeddings_nextn`);
* a one-layer decoder whose cache entry at position P is the pair ``(t_{P+1}, g_P)`` -- the
  token AFTER P with the target's features AT P, at RoPE position P -- and whose output row is
  the next token's logits plus a pre-norm hidden state that stands in for g at the next step.

`common_speculative_impl_draft_eagle3` (common/speculative.cpp) is the reference.  What follows
from the pairing, and what this proposer keeps:

* the last row of every batch of target rows cannot be written yet: its token t_{P+1} is not
  known.  Its g is kept (the deferred boundary) and written as soon as the token is -- by the
  next batch's first token, or by the draft's first decode, which pairs id_last (the target's
  freshest sample, at n_past) with g_{n_past-1} at position n_past-1;
* a draft continues one token per decode, each new token paired with the decoder's own pre-norm
  row of the step before; each token is the top candidate of a top-10 sampler, cut at the first
  whose probability (softmax over those 10) is below p_min.  llama.cpp drafts n_max tokens
  whatever the step's budget and applies n_min before cutting to the budget: the same here;
* after the draft only the first row (position n_past-1, whose token id_last stays) is kept;
* a rollback to n removes the row at n-1 too (its token t_n is not committed any more) and makes
  g_{n-1} the deferred boundary again: the g rows of the latest positions are kept for that.

Only the rows that stay in the target's cache reach the head (the loop injects id_last and the
accepted drafts), so the rows llama.cpp writes for rejected drafts and then cuts are never
written.  Features and tokens are queued when injected and encoded/decoded just before the next
draft.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from .. import _bindings as ext
from .._llama import BatchExt, Context, Model, seq_state, set_seq_state
from ..config import SpecConfig
from ..draft_models import Eagle3Info
from ..errors import LlamaCallError
from ..stats import SpecStats
from ..target import TargetContext, float_view
from .simple import DEFAULT_AR_N_MAX
from .rows import EmbdInput, RowQueue, RowWindow, draft_chain
from .topk import draft_length, finish_draft

__all__ = ["Eagle3Proposer"]



class Eagle3Proposer:
    """An EAGLE-3 head attached to a target context (see the module docstring).  Owns its model,
    context and batches; reads the target's embeddings and LM head through ctx_other."""

    needs_features = True

    def __init__(self, info: Eagle3Info, spec: SpecConfig, target: TargetContext, stats: SpecStats):
        if tuple(target.extract_layers) != tuple(info.target_layers):
            raise ValueError(f"the target context extracts layers {list(target.extract_layers)}, the EAGLE-3 head "
                             f"reads {list(info.target_layers)}")
        self.info = info
        self.spec = spec
        self.stats = stats
        self.target = target
        self.n_gpu_layers = spec.draft_gpu_layers(getattr(target.model, "n_gpu_layers", -1))
        self.model = Model(info.path, n_gpu_layers=self.n_gpu_layers, repack=target.model.repack)
        self.ctx: Optional[Context] = None
        try:
            params = target.draft_context_params(spec.draft_n_threads)
            self.ctx = Context(self.model, params, other=target.ctx)  # the target's embeddings and head
        except BaseException:
            self.model.close()
            raise
        self.enc_batch = BatchExt(self.ctx)
        self.dec_batch = BatchExt(self.ctx)
        # the decoder's pre-norm rows (and the encoder's g) are read through the nextn buffer
        ext.llama_set_embeddings_nextn(self.ctx.ptr, True, True)
        self.n_max = DEFAULT_AR_N_MAX if spec.adaptive else int(spec.draft_n_max)
        self.n_min = min(spec.draft_n_min, self.n_max)
        self.p_min = spec.draft_p_min
        self.n_embd = self.model.n_embd
        self.n_vocab = self.model.n_vocab
        self._chunk = self.ctx.n_ubatch  # the encoder takes at most one ubatch per call
        self._embd = EmbdInput(0)
        self._queue = RowQueue()  # (tokens, target features, pos0)
        self._end = 0  # decoder rows at positions < _end are in the cache, each complete
        self._g = RowWindow(self.n_embd, "the EAGLE-3 encoder's row")
        self._row = np.empty((1, self.n_embd), dtype=np.float32)  # a draft step's input row

    # ---- what the loop calls ----------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        """Nothing: the prompt's rows reached the head during prefill."""

    def inject(self, features: np.ndarray, pos0: int) -> None:
        """Rows at pos0.. of the target's last decode stay in its cache: queue their features and
        tokens (tokens found by position in that decode, copied: the next decode overwrites it)."""
        n = features.shape[0]
        if n == 0:
            return
        batch = self.target.batch
        first = pos0 - int(batch.pos[0]) if batch.n else -1
        if first < 0 or first + n > batch.n:
            raise LlamaCallError(f"EAGLE-3 rows {pos0}..{pos0 + n - 1} are not in the target's last decode")
        tokens = np.array(batch.token[first:first + n], dtype=np.int32)
        self._queue.put(tokens, np.ascontiguousarray(features, dtype=np.float32), pos0)

    def flush(self) -> None:
        """Encode every queued row and write the decoder rows whose next token is known."""
        if not self._queue:
            return
        t0 = time.perf_counter()
        for tokens, features, pos0 in self._queue.take():
            self._write(tokens, self._encode(features, pos0), pos0)
        self.stats.process_seconds += time.perf_counter() - t0

    def _encode(self, features: np.ndarray, pos0: int) -> np.ndarray:
        """g rows of `features` (one per target row), one encoder call per ubatch."""
        n = features.shape[0]
        g = np.empty((n, self.n_embd), dtype=np.float32)
        b = self.enc_batch
        base, stride, width = features.ctypes.data, features.strides[0], features.shape[1]
        for s in range(0, n, self._chunk):
            m = min(self._chunk, n - s)
            b.clear()
            # the encoder reads no positions, but llama.cpp checks that a batch continues the
            # sequence's cache: placeholder positions from its end (as llama.cpp's driver does)
            pos = self.ctx.pos_max(0) + 1
            for i in range(s, s + m):
                b.add_embd(self._embd.point(base + i * stride, width), pos + i - s)
            rc = int(ll.llama_process(self.ctx.ptr, ll.LLAMA_PROCESS_TYPE_ENCODE, b.ptr))
            if rc != 0:
                raise LlamaCallError(f"EAGLE-3 encoder failed on {m} rows at position {pos0 + s} (rc {rc})")
            ptr = ext.llama_get_embeddings_nextn(self.ctx.ptr)
            if not ptr:
                raise LlamaCallError("the EAGLE-3 encoder produced no output (llama_get_embeddings_nextn)")
            g[s:s + m] = float_view(ptr, (m, self.n_embd))
        return g

    def _write(self, tokens: np.ndarray, g: np.ndarray, pos0: int) -> None:
        """Decoder rows (t_{P+1}, g_P) for the positions P whose next token these rows give: the
        deferred boundary pos0-1 (if not written yet) and pos0..pos0+n-2; g_{pos0+n-1} waits."""
        n = len(tokens)
        start = max(self._end, pos0 - 1, 0)
        if start <= pos0 + n - 2:
            if start < pos0 and not self._g.knows(start):
                raise LlamaCallError(f"the EAGLE-3 head lost the target features of position {start}")
            if not self.ctx.seq_rm(0, start, -1):
                raise LlamaCallError(f"llama_memory_seq_rm failed on the EAGLE-3 context at {start}")
            b = self.dec_batch
            b.clear()
            self._embd.point(0, self.n_embd)
            base, stride = g.ctypes.data, g.strides[0]
            for p in range(start, pos0 + n - 1):
                idx = b.add_token(int(tokens[p + 1 - pos0]), p, False)
                self._embd.set_token_row(b, idx, base + (p - pos0) * stride if p >= pos0 else self._g.addr(p), p)
            rc = b.process()
            if rc != 0:
                raise LlamaCallError(f"EAGLE-3 decoder failed on {b.n} rows at position {start} (rc {rc})")
            self._end = pos0 + n - 1
        self._g.put(g, pos0)

    def knows(self, pos: int) -> bool:
        """Whether drafting (or writing rows) can resume at `pos`: g_{pos-1} is kept."""
        return pos == 0 or self._g.knows(pos - 1)

    def propose(self, id_last: int, n_past: int, n: int, *, shadow: bool = False,
                history: Sequence[int] = ()) -> list[int]:
        """Up to n tokens after id_last (at position n_past), one decoder call per token."""
        n = min(n, self.n_max)
        if n <= 0 or n_past <= 0:
            return []
        self.flush()
        pos = n_past - 1  # the deferred boundary: (id_last, g_{n_past-1})
        if self._end < pos or not self._g.knows(pos):
            return []  # the head lacks rows (a state restored behind its back)
        # llama.cpp drafts up to n_max and cuts to the budget after n_min: drafting past n only
        # decides n_min, so only that far
        n_want = min(draft_length(n, self.n_max, self.n_min), self.target.n_ctx - pos)
        t0 = time.perf_counter()
        self._row[0] = self._g.at(pos)

        def boundary_written() -> None:
            self._end = n_past  # the boundary row (id_last's) stays

        try:
            if not self.ctx.seq_rm(0, pos, -1):
                raise LlamaCallError(f"llama_memory_seq_rm failed on the EAGLE-3 context at {pos}")
            self._end = pos
            tokens = draft_chain(self.ctx, self.dec_batch, self._embd, self._row, id_last, pos, n_want, self.n_vocab,
                                 self.p_min, "the EAGLE-3 decoder", after_first=boundary_written)
        finally:
            # only the boundary row stays: the drafted cells go
            self.ctx.seq_rm(0, n_past, -1)
            self._end = min(self._end, n_past)
        return finish_draft(self.stats, tokens, n, self.n_min, t0, shadow)

    def accept(self, n_accepted: int) -> None:
        """Nothing: the accepted rows arrive through `inject`."""

    def rollback(self, n_past: int) -> None:
        """Keep what positions < n_past determine: rows < n_past-1 (the row at n_past-1 pairs it
        with the token at n_past, no longer committed); g_{n_past-1} becomes the boundary."""
        self._queue.cut(n_past)
        keep = max(0, n_past - 1)
        if self._end > keep:
            if not self.ctx.seq_rm(0, keep, -1):
                raise LlamaCallError(f"llama_memory_seq_rm failed on the EAGLE-3 context at {keep}")
            self._end = keep
        self._g.cut(n_past)

    def clear(self) -> None:
        self._queue.clear()
        self.ctx.clear()
        self._end = 0
        self._g.clear()

    def pos_max(self) -> int:
        self.flush()
        return self.ctx.pos_max(0)

    def get_state(self) -> tuple[bytes, int, np.ndarray, int]:
        """The decoder cache, its end and the kept g rows (the deferred boundary among them): what
        `set_state` needs to draft on (llama.cpp stashes the boundary the same way)."""
        self.flush()
        return (seq_state(self.ctx.ptr), self._end, *self._g.state())

    def set_state(self, state: tuple[bytes, int, np.ndarray, int]) -> bool:
        """Restore what `get_state` returned; False (and an empty cache) if llama.cpp refuses."""
        self.clear()
        if not set_seq_state(self.ctx.ptr, state[0]):
            self.ctx.clear()
            return False
        self._end = int(state[1])
        self._g.set_state((state[2], state[3]))
        return True

    def close(self) -> None:
        """Free the batches and the context, then the model (idempotent)."""
        for owner in ("enc_batch", "dec_batch", "ctx"):
            h = getattr(self, owner, None)
            if h is not None:
                h.close()
        self.model.close()
