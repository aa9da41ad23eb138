"""`MTPProposer`: the target's own multi-token-prediction (nextn) head as a drafter (`draft-mtp`).

Models such as Qwen3.5/3.6 (`qwen35`, `qwen35moe`) ship MTP blocks after their trunk.  llama.cpp
runs them in a second context of type `LLAMA_CONTEXT_TYPE_MTP` on the target's own model
(loaded with `load_mtp`), with its own KV cache; `common_speculative_impl_draft_mtp`
(common/speculative.cpp) is the reference for everything here:

* the MTP cache entry at position p is the pair (token x_p, the target's hidden state h_{p-1}):
  after every target decode the decoded rows go into the MTP context, each token with the
  previous row's `llama_get_embeddings_nextn` output (the first with the row before the batch);
* a draft starts at id_last (position n_past) with h_{n_past-1} and continues one token per
  decode, each new token paired with the MTP context's own hidden row of the step before; the
  drafted cells are removed afterwards;
* each token is the top candidate of its row; with p_min > 0 the draft stops at the first token
  whose probability (softmax over the top 10 logits) is below p_min; fewer than n_min: none.

Only the rows that stay in the target's cache reach the MTP context (the loop injects id_last
and the accepted drafts), so a rejection needs no extra work beyond cutting cells past n_past.
The hidden rows of the last few positions are kept so that the row before any position the loop
can rewind to is known.  One head (`nextn_predict_layers` 1) is driven; llama.cpp's chained heads
(step35) and shared-KV assistants (gemma4) are refused with a clear error.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from .. import _bindings as ext
from .._llama import BatchExt, Context
from ..config import SpecConfig
from ..errors import IncompatibleModelError, LlamaCallError
from ..stats import SpecStats
from ..target import TargetContext, float_view
from .rows import EmbdInput, RowQueue, RowWindow, draft_chain
from .topk import draft_length, finish_draft

__all__ = ["MTPProposer", "MTP_GRAPH_ARCHS", "DEFAULT_MTP_N_MAX", "mtp_layers"]

#: draft length of draft_n_max="auto" (the adaptive controller's ceiling); one head's drafts
#: lose accuracy quickly with depth
DEFAULT_MTP_N_MAX = 4
#: architectures whose llama.cpp graph has an MTP decoder (src/models/*.cpp, LLM_GRAPH_TYPE_DECODER_MTP)
MTP_GRAPH_ARCHS = frozenset({
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe",
    "glm5-next", "hy_v3", "mimo2", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
})


def mtp_layers(info) -> int:
    """`{arch}.nextn_predict_layers` of a target's GGUF info (0: no MTP head)."""
    value = info.get(f"{info.architecture}.nextn_predict_layers", 0)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def check_mtp_target(info) -> int:
    """The target must carry exactly one MTP block on an architecture llama.cpp drafts with;
    returns the block count.  IncompatibleModelError names the field otherwise."""
    arch = info.architecture
    key = f"{arch}.nextn_predict_layers"
    n = mtp_layers(info)
    if n <= 0:
        raise IncompatibleModelError(
            info.path, key, None if key not in info.metadata else n,
            "an MTP head (>= 1 nextn layer): draft-mtp drafts with the target's own multi-token-prediction "
            "block, and this file has none (convert the model with its MTP weights, or use another --spec-type)")
    if arch not in MTP_GRAPH_ARCHS:
        raise IncompatibleModelError(info.path, "general.architecture", arch,
                                     f"an architecture whose llama.cpp graph runs MTP blocks "
                                     f"({', '.join(sorted(MTP_GRAPH_ARCHS))})")
    if n > 1:
        raise IncompatibleModelError(info.path, key, n, "1 (chained MTP heads, as step35's, are not driven yet)")
    return n


class MTPProposer:
    """The MTP head of the target model, drafting from its own context (see the module docstring)."""

    needs_features = True  # it must see every target decode (its rows and hidden states)

    def __init__(self, spec: SpecConfig, target: TargetContext, stats: SpecStats):
        self.spec = spec
        self.stats = stats
        self.target = target
        model = target.model
        self.n_layers = int(ll.llama_model_n_layer_nextn(model.ptr))
        if self.n_layers <= 0:
            raise IncompatibleModelError(model.path, "load_mtp", False,
                                         "the target loaded with its MTP layers (Model(..., load_mtp=True))")
        self.n_max = DEFAULT_MTP_N_MAX if spec.adaptive else int(spec.draft_n_max)
        self.n_min = min(spec.draft_n_min, self.n_max)
        self.p_min = spec.draft_p_min
        self.n_embd = int(ll.llama_model_n_embd_out(model.ptr)) if hasattr(ll, "llama_model_n_embd_out") \
            else model.n_embd
        params = target.draft_context_params(spec.draft_n_threads)
        params.ctx_type = ll.LLAMA_CONTEXT_TYPE_MTP
        params.n_rs_seq = 0
        params.ctx_other = target.ctx.ptr  # as llama.cpp's driver (ignored for these graphs)
        self.ctx = Context(model, params)
        self.batch = BatchExt(self.ctx)
        # the target hands out every row's hidden state; this context only its output rows'
        ext.llama_set_embeddings_nextn(target.ctx.ptr, True, False)
        ext.llama_set_embeddings_nextn(self.ctx.ptr, True, True)
        self._embd = EmbdInput(self.n_embd)
        self._queue = RowQueue()  # (tokens, hidden rows, pos0)
        self._end = 0  # the MTP cache holds positions < _end
        self._hidden = RowWindow(self.n_embd, "the target's hidden state")
        self._row = np.empty((1, self.n_embd), dtype=np.float32)  # a draft step's input row

    # ---- what the loop calls ----------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        """Nothing: the prompt reached the MTP context row by row during prefill."""

    def inject(self, features: np.ndarray, pos0: int) -> None:
        """Rows at pos0.. of the target's last decode stay in its cache: queue their tokens and
        hidden states (copies: the next target decode overwrites both buffers).  They are found by
        position in that decode (the drop-in `Llama` commits accepted rows from its middle)."""
        n = features.shape[0]
        if n == 0:
            return
        batch = self.target.batch
        first = pos0 - int(batch.pos[0]) if batch.n else -1
        if first < 0 or first + n > batch.n:
            raise LlamaCallError(f"MTP rows {pos0}..{pos0 + n - 1} are not in the target's last decode")
        ptr = ext.llama_get_embeddings_nextn(self.target.ctx.ptr)
        if not ptr:
            raise LlamaCallError("the target produced no MTP hidden states (llama_get_embeddings_nextn)")
        hidden = np.array(float_view(ptr, (batch.n, self.n_embd))[first:first + n])
        tokens = np.array(batch.token[first:first + n], dtype=np.int32)
        self._queue.put(tokens, hidden, pos0)

    def flush(self) -> None:
        """Decode every queued row into the MTP context, each token with the row before it."""
        if not self._queue:
            return
        t0 = time.perf_counter()
        for tokens, hidden, pos0 in self._queue.take():
            self._decode_rows(tokens, hidden, pos0)
        self.stats.process_seconds += time.perf_counter() - t0

    def _decode_rows(self, tokens: np.ndarray, hidden: np.ndarray, pos0: int) -> None:
        n = len(tokens)
        skip = max(0, self._end - pos0)  # rows the cache already holds (a re-decoded prefix)
        inputs = np.empty((n, self.n_embd), dtype=np.float32)
        if skip < n:
            inputs[0] = self._hidden.at(pos0 - 1) if pos0 > 0 else 0.0
            inputs[1:] = hidden[:-1]
            if not self.ctx.seq_rm(0, pos0 + skip, -1):
                raise LlamaCallError(f"llama_memory_seq_rm failed on the MTP context at {pos0 + skip}")
            batch = self.batch
            batch.clear()
            base, stride = inputs.ctypes.data, inputs.strides[0]
            for i in range(skip, n):
                idx = batch.add_token(int(tokens[i]), pos0 + i, False)
                self._embd.set_token_row(batch, idx, base + i * stride, pos0 + i)
            rc = batch.process()
            if rc != 0:
                raise LlamaCallError(f"MTP context decode of {n - skip} rows at position {pos0 + skip} failed (rc {rc})")
            self._end = pos0 + n
        # the row before any position the loop may rewind to, or draft from
        self._hidden.put(hidden, pos0)

    def knows(self, pos: int) -> bool:
        """Whether drafting (or decoding rows) can resume at `pos`: the hidden state of the row
        before it is kept."""
        return pos == 0 or self._hidden.knows(pos - 1)

    def propose(self, id_last: int, n_past: int, n: int, *, shadow: bool = False,
                history: Sequence[int] = ()) -> list[int]:
        """Up to n tokens after id_last (at position n_past), one MTP decode per token."""
        n = min(n, self.n_max)
        n_want = min(draft_length(n, self.n_max, self.n_min), self.target.n_ctx - n_past)
        if n <= 0 or n_want <= 0:
            return []
        self.flush()
        t0 = time.perf_counter()
        self._row[0] = self._hidden.at(n_past - 1) if n_past > 0 else 0.0
        try:
            tokens = draft_chain(self.ctx, self.batch, self._embd, self._row, id_last, n_past, n_want,
                                 self.target.n_vocab, self.p_min, "the MTP head")
        finally:
            # keep only rows of committed positions: the drafted cells go
            self.ctx.seq_rm(0, n_past, -1)
            self._end = min(self._end, n_past)
        return finish_draft(self.stats, tokens, n, self.n_min, t0, shadow)

    def accept(self, n_accepted: int) -> None:
        """Nothing: the accepted rows arrive through `inject`."""

    def rollback(self, n_past: int) -> None:
        """Forget everything at n_past and beyond (queued rows included)."""
        self._queue.cut(n_past)
        if self._end > n_past:
            if not self.ctx.seq_rm(0, n_past, -1):
                raise LlamaCallError(f"llama_memory_seq_rm failed on the MTP context at {n_past}")
            self._end = n_past
        self._hidden.cut(n_past)

    def clear(self) -> None:
        self._queue.clear()
        self.ctx.clear()
        self._end = 0
        self._hidden.clear()

    def pos_max(self) -> int:
        self.flush()
        return self.ctx.pos_max(0)

    def close(self) -> None:
        """Free the batch and the MTP context (the model is the target's: its owner frees it)."""
        for owner in ("batch", "ctx"):
            h = getattr(self, owner, None)
            if h is not None:
                h.close()
        target = getattr(self, "target", None)
        if target is not None and not target.ctx.closed:
            ext.llama_set_embeddings_nextn(target.ctx.ptr, False, False)
