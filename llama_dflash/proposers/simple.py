"""`SimpleDraftProposer`: a classic small autoregressive draft model (llama.cpp's `draft-simple`).

The draft is an ordinary language model with the target's vocabulary, in a context and KV cache
of its own.  `common_speculative_impl_draft_simple` (common/speculative.cpp) and the loop of
`examples/speculative-simple` are the reference for what happens when:

* every target decode is decoded by the draft too (prompt chunks and verification batches), so
  its cache holds the same tokens at the same positions as the target's;
* a draft starts with id_last at position n_past and continues one token per decode, each the
  top candidate of a top-10 sampler; with p_min > 0 it stops at the first token whose
  probability (softmax over those 10) is below p_min, and at n_max or the step's budget; fewer
  than n_min tokens: none.  The drafted cells are removed afterwards (id_last's too: it comes
  back with the verification batch);
* after a rejection the cells past the accepted prefix go (`rollback`).

Only the rows that stay in the target's cache reach the draft here (the loop injects id_last and
the accepted drafts), which leaves its cache as llama.cpp's is after its cut.  Their tokens are
read from the target's last decode, by position, when they are injected (the drop-in `Llama`
commits accepted rows from a verification batch's middle) and decoded lazily, just before the
next draft.

The draft's cache must be cut at any position: recurrent and hybrid drafts are refused.  Its
vocabulary may have up to 128 tokens more than the target's (llama.cpp's rule); a draft stops
before a token the target does not have.
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np

from .._batch import TokenBatch
from .._llama import Context, Model, seq_state, set_seq_state
from ..config import SpecConfig
from ..draft_models import SimpleDraftInfo, check_vocab_compatible
from ..errors import IncompatibleModelError, LlamaCallError
from ..rewind import is_recurrent_model
from ..stats import SpecStats
from ..target import TargetContext
from .topk import draft_length, finish_draft, row_logits, top_candidate

__all__ = ["SimpleDraftProposer", "DEFAULT_AR_N_MAX"]

#: draft length of draft_n_max="auto" (the adaptive controller's ceiling) for autoregressive drafts
DEFAULT_AR_N_MAX = 8


class SimpleDraftProposer:
    """A draft model in a context of its own, fed every token the target keeps (see the module
    docstring).  Owns its model, context and batch."""

    needs_features = True  # it must see every target decode (its rows' tokens)

    def __init__(self, info: SimpleDraftInfo, spec: SpecConfig, target: TargetContext, stats: SpecStats):
        self.info = info
        self.spec = spec
        self.stats = stats
        self.target = target
        self.n_gpu_layers = spec.draft_gpu_layers(getattr(target.model, "n_gpu_layers", -1))
        self.model = Model(info.path, n_gpu_layers=self.n_gpu_layers, repack=target.model.repack)
        self.ctx = None
        try:
            self._check_model(os.path.basename(target.model.path))
            params = target.draft_context_params(spec.draft_n_threads)
            self.ctx = Context(self.model, params)
        except BaseException:
            self.model.close()
            raise
        self.batch = TokenBatch(self.ctx.n_batch)
        self.n_max = DEFAULT_AR_N_MAX if spec.adaptive else int(spec.draft_n_max)
        self.n_min = min(spec.draft_n_min, self.n_max)
        self.p_min = spec.draft_p_min
        self.n_vocab = self.model.n_vocab  # the draft's logits rows
        self._queue: list[tuple[np.ndarray, int]] = []  # (tokens, pos0) not decoded yet
        self._end = 0  # the draft cache holds positions < _end

    def _check_model(self, target_name: str) -> None:
        if is_recurrent_model(self.model):
            raise IncompatibleModelError(
                self.info.path, "general.architecture", self.info.gguf.architecture,
                "an attention-only draft model for draft-simple (a recurrent or hybrid draft's state cannot be "
                "cut back after a rejected draft)")
        check_vocab_compatible(self.target.model.vocab, self.model.vocab, self.info.path,
                               f"the target {target_name}")

    # ---- what the loop calls ----------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        """Nothing: the prompt reached the draft with the target's prefill."""

    def inject(self, features: np.ndarray, pos0: int) -> None:
        """Rows at pos0.. of the target's last decode stay in its cache: queue their tokens
        (found by position in that decode; a copy, the next decode overwrites the batch)."""
        n = features.shape[0]
        if n == 0:
            return
        batch = self.target.batch
        first = pos0 - int(batch.pos[0]) if batch.n else -1
        if first < 0 or first + n > batch.n:
            raise LlamaCallError(f"draft rows {pos0}..{pos0 + n - 1} are not in the target's last decode")
        self._queue.append((np.array(batch.token[first:first + n], dtype=np.int32), pos0))

    def flush(self) -> None:
        """Decode every queued row into the draft's cache, one decode per target decode (as
        llama.cpp's driver hands them over)."""
        if not self._queue:
            return
        t0 = time.perf_counter()
        queue, self._queue = self._queue, []
        for tokens, pos0 in queue:
            if pos0 < self._end:  # rows of positions it holds already: decoded again
                self._cut(pos0)
            step = self.batch.n_max
            for s in range(0, len(tokens), step):
                chunk = tokens[s:s + step]
                self.batch.set(chunk, pos0 + s, logits="none")
                rc = self.batch.decode(self.ctx.ptr)
                if rc != 0:
                    raise LlamaCallError(f"draft decode of {len(chunk)} rows at position {pos0 + s} failed (rc {rc})")
            self._end = pos0 + len(tokens)
        self.stats.process_seconds += time.perf_counter() - t0

    def propose(self, id_last: int, n_past: int, n: int, *, shadow: bool = False,
                history: Sequence[int] = ()) -> list[int]:
        """Up to min(n, n_max) tokens after id_last (at position n_past), one draft decode per token."""
        n = min(n, self.n_max)
        n_want = draft_length(n, self.n_max, self.n_min)
        if n <= 0 or n_past + n_want > self.target.n_ctx:
            return []
        self.flush()
        if self._end != n_past:
            if self._end < n_past:  # the draft lacks rows (a state restored behind its back)
                return []
            self._cut(n_past)
        t0 = time.perf_counter()
        tokens: list[int] = []
        with_prob = self.p_min > 0.0
        n_target = self.target.n_vocab
        try:
            tok = id_last
            for i in range(n_want):
                self.batch.set((tok,), n_past + i, logits="last")
                rc = self.batch.decode(self.ctx.ptr)
                if rc != 0:
                    raise LlamaCallError(f"draft decode at position {n_past + i} failed (rc {rc})")
                tok, prob = top_candidate(row_logits(self.ctx.ptr, 0, self.n_vocab, "the draft model"), with_prob)
                if prob < self.p_min or tok >= n_target:
                    break
                tokens.append(tok)
        finally:
            self._cut(n_past)  # the drafted cells (and id_last's) go
        return finish_draft(self.stats, tokens, n, self.n_min, t0, shadow)

    def _cut(self, pos: int) -> None:
        if not self.ctx.seq_rm(0, pos, -1):
            raise LlamaCallError(f"llama_memory_seq_rm failed on the draft context at {pos}")
        self._end = min(self._end, pos)

    def accept(self, n_accepted: int) -> None:
        """Nothing: the accepted rows arrive through `inject`."""

    def rollback(self, n_past: int) -> None:
        """Forget everything at n_past and beyond (queued rows included)."""
        kept = []
        for tokens, pos0 in self._queue:
            if pos0 < n_past:
                kept.append((tokens[: n_past - pos0], pos0))
        self._queue = kept
        if self._end > n_past:
            self._cut(n_past)

    def clear(self) -> None:
        self._queue = []
        self.ctx.clear()
        self._end = 0

    def knows(self, pos: int) -> bool:
        return True

    def pos_max(self) -> int:
        self.flush()
        return self.ctx.pos_max(0)

    def get_state(self) -> tuple[bytes, int]:
        """The draft cache (queued rows written first) and its end, for `set_state`."""
        self.flush()
        return seq_state(self.ctx.ptr), self._end

    def set_state(self, state: tuple[bytes, int]) -> bool:
        """Restore what `get_state` returned; False (and an empty cache) if llama.cpp refuses."""
        self.clear()
        if not set_seq_state(self.ctx.ptr, state[0]):
            self.ctx.clear()
            return False
        self._end = int(state[1])
        return True

    def close(self) -> None:
        """Free the context, then the model (idempotent)."""
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            ctx.close()
        self.model.close()
