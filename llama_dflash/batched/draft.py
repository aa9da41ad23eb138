"""A DFlash/DSpark/DFlash2 draft for every sequence of a `BatchedEngine`.

One draft context holds `n_seq` streams (seq ids = the engine's slots), attached to the engine's
target context through `ctx_other` (the draft reads the target's embeddings and LM head).  What
llama.cpp's `common_speculative` does for `llama-server -np N`, done from Python:

  - features: after a target decode, the inputs of the draft's target layers for each sequence's
    committed rows are queued for that sequence's stream and written in one decode of feature rows
    (all sequences together) just before the draft is next used or once a batch of them is full;
  - drafting: ONE decode holds every drafting sequence's block `[id_last, MASK...]` (equal-sized
    blocks: the DSpark Markov head needs them, and llama.cpp splits a multi-sequence batch into
    ubatches of equal rows per sequence, which must not cut a non-causal block), each at its own
    positions in its own stream; the block's cells are removed right after;
  - a slot's cells stay when its request ends, so the next request of that slot reuses the prefix
    both contexts hold (`truncate`).

llama.cpp returns logits, layer inputs and confidences in batch order whatever ubatches it made
(`output_reorder`), so rows are read by their batch index.
"""

from __future__ import annotations

import ctypes
import time
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from .. import _bindings as ext
from .._batch import logits_addr
from .._llama import BatchExt, Context, Model
from ..config import SpecConfig, is_default
from ..errors import IncompatibleModelError, LlamaCallError
from ..inspect import DraftInfo
from ..proposers.dflash import CANDIDATES, _backend_sampling_choice, _report_fallback, selector_walk
from ..target import float_view
from .prompt_cache import load_seq_state, save_seq_state

__all__ = ["BatchedDraft", "Block"]


@dataclass
class Block:
    """One sequence's draft request in a step: its slot, last sampled token and its position."""

    seq_id: int
    id_last: int
    pos: int
    tokens: Optional[list[int]] = None  # the proposal, filled by `BatchedDraft.propose`
    n: int = 0  # the step's budget for this block (0: none); autoregressive drafts stop there


class BatchedDraft:
    """The draft model's context for all slots (see the module docstring).  One owner: the engine."""

    def __init__(self, info: DraftInfo, spec: SpecConfig, target_model: Model, target_ctx: Context, *,
                 n_seq: int, n_ctx_seq: int, n_threads: int, n_gpu_layers: int):
        self.info = info
        self.n_seq = n_seq
        self.n_gpu_layers = spec.draft_gpu_layers(n_gpu_layers)
        self.model = Model(info.path, n_gpu_layers=self.n_gpu_layers, repack=target_model.repack)
        self.ctx: Optional[Context] = None
        self._chains: list[int] = []
        self.inject_batch: Optional[BatchExt] = None
        self.block_batch: Optional[BatchExt] = None
        try:
            self._setup(info, spec, target_ctx, n_seq, n_ctx_seq, n_threads)
        except BaseException:
            self.close()
            raise

    def _setup(self, info: DraftInfo, spec: SpecConfig, target_ctx: Context, n_seq: int, n_ctx_seq: int,
               n_threads: int) -> None:
        limit = info.max_draft_tokens
        if spec.adaptive:
            self.n_max = limit
        else:
            if spec.draft_n_max > limit and not is_default(spec.draft_n_max):
                warnings.warn(f"draft_n_max={spec.draft_n_max} exceeds what the draft's block (block_size "
                              f"{info.block_size}) can yield; clamped to {limit}", stacklevel=4)
            self.n_max = min(int(spec.draft_n_max), limit)
        self.n_min = min(spec.draft_n_min, self.n_max)
        self.p_min = spec.draft_p_min
        if info.algorithm == "dspark" and self.p_min > 0 and not info.has_confidence_head:
            raise ValueError(f"{info.path}: the DSpark draft has no confidence head "
                             "(dflash.has_confidence_head is false); set draft_p_min to 0")
        self.selector_top_k = 0
        if info.is_dflash2:
            self.selector_top_k = int(ext.llama_model_dflash_selector_top_k(self.model.ptr))
            if self.selector_top_k <= 0:
                raise IncompatibleModelError(info.path, "dflash.selector_top_k", self.selector_top_k,
                                             "a positive integer (the draft has DFlash2 selector tensors)")
        # the block is always decoded at its full length, as llama.cpp's driver and DFlashProposer do
        self.n_block = min(info.block_size, self.n_max + (0 if info.anchor_first else 1))
        self.first_slot = 0 if info.anchor_first else 1
        params = ll.llama_context_default_params()
        params.n_seq_max = n_seq
        params.kv_unified = False  # one stream per slot, as the target's
        params.n_ctx = n_ctx_seq * n_seq
        # every sequence's whole block must fit one ubatch (non-causal attention within a block)
        n_ub = max(n_seq * info.block_size, 512)
        params.n_batch = n_ub
        params.n_ubatch = n_ub
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        want_backend, self.backend_sampling_reason = _backend_sampling_choice(spec, info, self.n_gpu_layers)
        if want_backend:
            # a backend sampler handles at most n_outputs_max_per_seq outputs of a sequence per decode
            params.n_outputs_max_per_seq = info.block_size
        self.ctx = Context(self.model, params, other=target_ctx)  # ctx_other: the target's head
        if want_backend:
            self._attach_backend_samplers()
        elif spec.backend_sampling is True:
            _report_fallback(self.backend_sampling_reason)
        self.inject_batch = BatchExt(self.ctx)
        self.block_batch = BatchExt(self.ctx)
        ll.llama_set_causal_attn(self.ctx.ptr, info.causal_attention)
        ext.llama_set_embeddings_nextn(self.ctx.ptr, True, not info.is_dflash2)
        self._chunk = n_ub
        self.n_vocab = self.model.n_vocab
        self.n_embd = self.model.n_embd
        self._pending: list[tuple[int, int, np.ndarray]] = []  # (seq id, first position, features)
        self._pending_rows = 0
        self._embd = ll.llama_embd(None, 1, 0)
        self._embd_data = ctypes.c_void_p.from_buffer(self._embd, ll.llama_embd.data.offset)
        self.draft_seconds = 0.0
        self.inject_seconds = 0.0
        self.blocks = 0

    # ---- top-k candidates on the backend (one chain per slot, as llama.cpp's server attaches them) ----
    def _attach_backend_samplers(self) -> None:
        ctx = self.ctx.ptr
        for sid in range(self.n_seq):
            chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
            if chain:
                ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(CANDIDATES))
            if not chain or not ll.llama_set_sampler(ctx, sid, chain):
                if chain:
                    ll.llama_sampler_free(chain)
                self._detach_backend_samplers(ctx)
                self.backend_sampling_reason = "llama_set_sampler refused the top-k chain (backend cannot offload it)"
                _report_fallback(self.backend_sampling_reason)
                return
            self._chains.append(chain)
        self.backend_sampling_reason = None
        self.ctx.on_close(lambda: self._detach_backend_samplers(ctx))  # before llama_free, whoever closes it

    def _detach_backend_samplers(self, ctx_ptr: Optional[int] = None) -> None:
        chains, self._chains = self._chains, []
        for sid, chain in enumerate(chains):
            if ctx_ptr is not None:
                ll.llama_set_sampler(ctx_ptr, sid, None)
            ll.llama_sampler_free(chain)

    @property
    def backend_sampling_active(self) -> bool:
        return bool(self._chains)

    def _backend_top(self, r: int, with_prob: bool) -> Optional[tuple[int, float]]:
        """Row r's top candidate from the backend chain (ties: lowest id) and, if asked, its
        probability over the candidates; None when the backend gave nothing for the row."""
        ctx = self.ctx.ptr
        n_c = int(ll.llama_get_sampled_candidates_count_ith(ctx, r))
        ids_p = ll.llama_get_sampled_candidates_ith(ctx, r)
        lg_p = ll.llama_get_sampled_logits_ith(ctx, r)
        n_l = int(ll.llama_get_sampled_logits_count_ith(ctx, r)) if lg_p else 0
        if not (ids_p and lg_p and n_c > 0 and n_l == n_c):
            return None
        logits = float_view(lg_p, (n_c,))
        top = logits.max()
        best = np.flatnonzero(logits == top)
        tok = min(int(ids_p[int(j)]) for j in best)
        return tok, (float(1.0 / np.exp(logits - top).sum()) if with_prob else 1.0)

    def close(self) -> None:
        if getattr(self, "ctx", None) is not None and not self.ctx.closed:
            self._detach_backend_samplers(self.ctx.ptr)
        for owner in ("inject_batch", "block_batch", "ctx"):
            h = getattr(self, owner, None)
            if h is not None:
                h.close()
        self.model.close()

    # ---- features -------------------------------------------------------------------------------
    def inject(self, seq_id: int, pos0: int, features: np.ndarray, tokens: Sequence[int] = ()) -> None:
        """Queue `features` (rows for positions pos0.., C-contiguous float32, not modified later);
        the rows' `tokens` are not needed (the draft reads features only)."""
        if features.shape[0] == 0:
            return
        self._pending.append((seq_id, pos0, features))
        self._pending_rows += features.shape[0]
        if self._pending_rows >= self._chunk:
            self.flush()

    def flush(self) -> None:
        """Write every queued feature row into its stream, in as few decodes as fit."""
        if not self._pending:
            return
        t0 = time.perf_counter()
        b, emb, data = self.inject_batch, self._embd, self._embd_data
        b.clear()
        count = 0
        try:
            for sid, pos0, features in self._pending:
                emb.n_embd = features.shape[1]
                base, stride = features.ctypes.data, features.strides[0]
                for i in range(features.shape[0]):
                    if count == self._chunk:
                        self._process_injection(pos0 + i)
                        count = 0
                    data.value = base + i * stride
                    b.add_embd(emb, pos0 + i, sid)
                    count += 1
            if count:
                self._process_injection(-1)
        finally:
            self._pending.clear()
            self._pending_rows = 0
            self.inject_seconds += time.perf_counter() - t0

    def _process_injection(self, pos: int) -> None:
        rc = self.inject_batch.process()
        self.inject_batch.clear()
        if rc != 0:
            raise LlamaCallError(f"draft feature injection failed (llama_process returned {rc}, near position {pos})")

    def truncate(self, seq_id: int, n_keep: int) -> None:
        """Keep positions < n_keep of a slot (queued rows included): a new request's reused prefix."""
        kept = []
        for sid, p0, f in self._pending:
            if sid != seq_id:
                kept.append((sid, p0, f))
            elif p0 < n_keep:
                kept.append((sid, p0, f[: n_keep - p0]))
        self._pending = kept
        self._pending_rows = sum(f.shape[0] for _, _, f in kept)
        self.ctx.seq_rm(seq_id, n_keep, -1)

    def resume_point(self, seq_id: int, n_keep: int) -> int:
        """The longest prefix <= n_keep the slot's draft can resume from: its cells are features."""
        return n_keep

    def save_slot(self, seq_id: int):
        """The slot's cells for the prompt cache (queued features written first); None if none."""
        self.flush()
        return save_seq_state(self.ctx.ptr, seq_id)

    def load_slot(self, seq_id: int, saved) -> bool:
        return load_seq_state(self.ctx.ptr, seq_id, saved)

    def fits(self, pos: int, n_ctx_seq: int) -> bool:
        """Whether a block at `pos` fits the slot (its cells must exist)."""
        return pos + self.n_block <= n_ctx_seq

    # ---- drafting -------------------------------------------------------------------------------
    def propose(self, blocks: Sequence[Block]) -> None:
        """Fill every block's `tokens`: one decode of all of them (see the module docstring)."""
        if not blocks:
            return
        self.flush()
        t0 = time.perf_counter()
        try:
            self._decode_blocks(blocks)
            if not self._chains:
                self._read(blocks)
            elif not self._read_backend(blocks):  # the backend gave no candidates: again, on the CPU path
                for blk in blocks:
                    self.ctx.seq_rm(blk.seq_id, blk.pos, -1)
                self._decode_blocks(blocks)
                self._read(blocks)
        finally:
            for blk in blocks:  # keep only the injected features: the blocks' own K/V must not stay
                self.ctx.seq_rm(blk.seq_id, blk.pos, -1)
            self.draft_seconds += time.perf_counter() - t0
            self.blocks += 1

    def _decode_blocks(self, blocks: Sequence[Block]) -> None:
        b, n_block, mask = self.block_batch, self.n_block, self.info.mask_token_id
        outputs = not self.info.is_dflash2  # every row an output (see DFlashProposer._draft_block)
        b.clear()
        for blk in blocks:
            b.add_token(blk.id_last, blk.pos, outputs, blk.seq_id)
            for i in range(1, n_block):
                b.add_token(mask, blk.pos + i, outputs, blk.seq_id)
        rc = b.process()
        if rc != 0:
            raise LlamaCallError(f"draft block decode of {len(blocks)} sequences failed (llama_process returned {rc})")

    def _read(self, blocks: Sequence[Block]) -> None:
        n_block, ctx = self.n_block, self.ctx.ptr
        if self.info.is_dflash2:
            ptr = ext.llama_get_embeddings_nextn(ctx)
            if not ptr:
                raise LlamaCallError("the DFlash2 draft produced no selector lattice (llama_get_embeddings_nextn)")
            lattice = float_view(ptr, (len(blocks) * n_block, self.n_embd))
            for j, blk in enumerate(blocks):
                blk.tokens = self._cut(selector_walk(lattice[j * n_block:(j + 1) * n_block], self.selector_top_k,
                                                     self.p_min))
            return
        ptr = logits_addr(ctx)
        if not ptr:
            raise LlamaCallError("the draft blocks produced no logits")
        rows = float_view(ptr, (len(blocks) * n_block, self.n_vocab))
        dspark = self.info.algorithm == "dspark"
        # no confidences (a NULL pointer): llama.cpp's driver drafts without the filter, so do we
        conf = self._confidences(len(blocks) * n_block)
        with_prob = not dspark and self.p_min > 0
        first = self.first_slot
        if conf is None and not with_prob:
            # no filter: every slot's top token in one argmax (the first maximum: the lowest id on ties)
            top = rows.argmax(axis=1).reshape(len(blocks), n_block)[:, first:]
            for j, blk in enumerate(blocks):
                blk.tokens = self._cut(top[j].tolist())
            return
        for j, blk in enumerate(blocks):
            out: list[int] = []
            for i in range(first, n_block):
                r = j * n_block + i
                if conf is not None and conf[r] < self.p_min:  # strict `<`, as llama.cpp
                    break
                row = rows[r]
                tok = int(np.argmax(row))
                if with_prob:
                    cand = row[np.argpartition(row, -CANDIDATES)[-CANDIDATES:]]
                    if float(1.0 / np.exp(cand - row[tok]).sum()) < self.p_min:
                        break
                out.append(tok)
            blk.tokens = self._cut(out)

    def _confidences(self, n_rows: int) -> Optional[np.ndarray]:
        if self.info.algorithm != "dspark" or self.p_min <= 0:
            return None
        cptr = ext.llama_get_embeddings_nextn(self.ctx.ptr)
        return float_view(cptr, (n_rows, self.n_embd))[:, 0] if cptr else None

    def _read_backend(self, blocks: Sequence[Block]) -> bool:
        """The blocks' tokens from the backend's top-k candidates (no vocabulary-wide rows cross to
        the host); False, and the CPU path for good, where the backend gave none."""
        n_block, first = self.n_block, self.first_slot
        conf = self._confidences(len(blocks) * n_block)
        with_prob = self.info.algorithm != "dspark" and self.p_min > 0
        proposals = []
        for j in range(len(blocks)):
            out: list[int] = []
            for i in range(first, n_block):
                r = j * n_block + i
                if conf is not None and conf[r] < self.p_min:
                    break
                got = self._backend_top(r, with_prob)
                if got is None:
                    self._detach_backend_samplers(self.ctx.ptr)
                    self.backend_sampling_reason = f"no sampled candidates for draft row {r}"
                    _report_fallback(self.backend_sampling_reason)
                    return False
                if got[1] < self.p_min:
                    break
                out.append(got[0])
            proposals.append(out)
        for blk, out in zip(blocks, proposals):
            blk.tokens = self._cut(out)
        return True

    def _cut(self, tokens: list[int]) -> list[int]:
        return [] if len(tokens) < self.n_min else tokens[: self.n_max]
