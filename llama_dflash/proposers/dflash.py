"""The DFlash/DSpark/DFlash2 draft model as a proposer.

`DFlashProposer` runs a DFlash/DSpark/DFlash2 draft GGUF: target-layer features are injected
into its KV cache after every target decode, and one non-causal decode of `[last, MASK...]`
yields a whole block.

BLOCK SEMANTICS (issue 12 item 2).  Attention inside the block is non-causal, so every slot's
proposal depends on how many MASK slots follow it.  llama.cpp's driver always decodes the block at
n_max (+1 for the anchor) and applies p_min, n_min and the cut to what fits afterwards; this
proposer does the same: `block_tokens` is n_max (+1) whatever the caller asks for (under "auto",
n_max is the draft's own block: the trained block size), shortened only where the context ends.
The adaptive controller therefore chooses how many of one fixed block's tokens to verify: the
per-slot acceptance it learns is that block's, and its draft cost is flat in k.
Measured before choosing (bench/block_length.py: SmolLM2-135M Q4_1 + the shipped trained draft,
block 8, 12 built-in prompts x 128 greedy tokens teacher-forced = 1437 positions, 1 thread):
  - proposals do change with the block length: slot 1's token of a 2-row block differs from the
    8-row block's at 22% of positions (5 rows: 4.5%, 7 rows: 0.6%);
  - acceptance does not measurably change: slot 1 accepted at 0.154 / 0.159 / 0.159 / 0.157 /
    0.158 / 0.157 / 0.157 for blocks of 2..8 rows (slot 2: 0.04-0.07 on ~230 trials, noise);
  - cost, block decode / one ordinary decode (median, CPU under load): 2 rows 0.57, 3: 0.96,
    4: 0.73, 5: 1.12, 6: 0.82, 7: 1.22, 8: 0.84 -- odd lengths are slower on this CPU, so the
    full 8-row block is cheaper than the n+1 block for n = 2, 4, 6; only n = 1 and 3 would save
    (and k = 1 never pays on this CPU: verifying 2 rows alone costs 1.5 ordinary decodes).
So the shorter block bought nothing in acceptance and little in cost; llama.cpp's semantics win
(same proposals as its driver for the same settings, and an acceptance model that describes the
block decoded).
"""

from __future__ import annotations

import ctypes
import logging
import time
import warnings
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from .. import _bindings as ext
from .._batch import TokenBatch, logits_addr, logits_ith_addr
from .._llama import BatchExt, Context, Model
from ..config import SpecConfig, is_default
from ..errors import IncompatibleModelError, LlamaCallError
from ..inspect import DraftInfo
from ..stats import SpecStats
from ..target import TargetContext, default_threads, float_view

__all__ = ["DFlashProposer", "selector_walk"]

CANDIDATES = 10  # top-k read per draft slot, as llama.cpp's driver does

log = logging.getLogger("llama_dflash")
_reported_fallbacks: set[str] = set()


def _backend_sampling_choice(spec: SpecConfig, info: DraftInfo, n_gpu_layers: int) -> tuple[bool, Optional[str]]:
    """Whether to attach the top-k chain to the draft context, and if not, why not."""
    if spec.backend_sampling is False:
        return False, "not requested"
    if info.is_dflash2:
        return False, "DFlash2 drafts read their selector lattice, not candidates"
    if spec.backend_sampling == "auto" and not (ll.llama_supports_gpu_offload() and n_gpu_layers != 0):
        return False, "auto: the draft runs on the CPU, where reading its rows costs less than a top-k in its graph"
    return True, None


def _report_fallback(reason: str) -> None:
    """Log (once per reason per process) why backend candidate sampling is not used."""
    if reason in _reported_fallbacks:
        return
    _reported_fallbacks.add(reason)
    msg = f"backend draft sampling unavailable, using the CPU path: {reason}"
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


class DFlashProposer:
    """A DFlash or DSpark draft context attached to a target context through `ctx_other`."""

    def __init__(self, info: DraftInfo, spec: SpecConfig, target: TargetContext, stats: SpecStats):
        self.info = info
        self.spec = spec
        self.stats = stats
        self.target = target
        self.n_gpu_layers = spec.draft_gpu_layers(getattr(target.model, "n_gpu_layers", -1))
        self.model = Model(info.path, n_gpu_layers=self.n_gpu_layers, repack=target.model.repack)
        self.n_max = info.max_draft_tokens if spec.adaptive else self._clamp_n_max(spec.draft_n_max)
        self.n_min = min(spec.draft_n_min, self.n_max)
        self.p_min = spec.draft_p_min
        self.mask = info.mask_token_id
        self.anchor_first = info.anchor_first
        self.selector_top_k = 0
        if info.is_dflash2:
            # llama.cpp has checked at load that n_embd holds top_k ids + top_k^2 scores per row
            self.selector_top_k = int(ext.llama_model_dflash_selector_top_k(self.model.ptr))
            if self.selector_top_k <= 0:
                self.model.close()
                raise IncompatibleModelError(info.path, "dflash.selector_top_k", self.selector_top_k,
                                             "a positive integer (the draft has DFlash2 selector tensors)")
        if info.algorithm == "dspark" and self.p_min > 0 and not info.has_confidence_head:
            self.model.close()
            raise ValueError(
                f"{info.path}: the DSpark draft has no confidence head "
                "(dflash.has_confidence_head is false); set draft_p_min to 0"
            )

        params = ll.llama_context_default_params()
        params.n_ctx = target.n_ctx
        # a non-causal block must fit in one ubatch
        n_ub = max(info.block_size, min(512, target.ctx.n_ubatch))
        params.n_batch = n_ub
        params.n_ubatch = n_ub
        params.n_seq_max = 1
        threads = spec.draft_n_threads or target.config.n_threads or default_threads()
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        want_backend, not_used = _backend_sampling_choice(spec, info, self.n_gpu_layers)
        if want_backend:
            # a backend sampler handles at most n_outputs_max_per_seq outputs of a sequence per decode
            params.n_outputs_max_per_seq = info.block_size
        try:
            self.ctx = Context(self.model, params, other=target.ctx)  # ctx_other: the target's head
        except Exception:
            self.model.close()
            raise
        self._chain = None
        self.backend_sampling_active = False
        self.backend_sampling_reason = not_used
        if want_backend:
            self._attach_backend_sampler()
        elif spec.backend_sampling is True:
            _report_fallback(not_used)
        self.batch = TokenBatch(info.block_size)  # the block's rows
        self.inject_batch = BatchExt(self.ctx)  # feature rows: wider than token embeddings
        ll.llama_set_causal_attn(self.ctx.ptr, info.causal_attention)
        ext.llama_set_embeddings_nextn(self.ctx.ptr, True, not info.is_dflash2)
        self.n_vocab = self.model.n_vocab
        self.n_embd = self.model.n_embd
        self._chunk = n_ub
        self._pending: list[tuple[np.ndarray, int]] = []  # features queued by inject() (C-contiguous f32)
        self._pending_rows = 0
        self._embd = ll.llama_embd(None, 1, 0)
        self._embd_data = ctypes.c_void_p.from_buffer(self._embd, ll.llama_embd.data.offset)
        # the injection batch's pointer as a ctypes object (no conversion per call) and the 4-entry
        # position array llama_batch_ext_set_pos copies from (M-RoPE layout: p, p, p, 0)
        self._inject_ptr = ctypes.c_void_p(self.inject_batch.ptr)
        self._inject_pos = (ll.llama_pos * 4)(0, 0, 0, 0)
        # no cell at a position >= _cache_end is in the draft cache (None: not known).  Known only
        # from what this object did since its own last seq_rm, so that a rollback to a position
        # the cache never reached needs no llama_memory_seq_rm (issue 28 item 5: one C call a step)
        self._cache_end: Optional[int] = None

    # ---- backend-side candidate sampling (top-k chain attached to the draft context) ------------
    def _attach_backend_sampler(self) -> None:
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if not chain:
            self.backend_sampling_reason = "llama_sampler_chain_init failed"
            _report_fallback(self.backend_sampling_reason)
            return
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(CANDIDATES))
        if not ll.llama_set_sampler(self.ctx.ptr, 0, chain):
            ll.llama_sampler_free(chain)
            self.backend_sampling_reason = "llama_set_sampler refused the top-k chain (backend cannot offload it)"
            _report_fallback(self.backend_sampling_reason)
            return
        self._chain = chain
        self.backend_sampling_active = True
        self.backend_sampling_reason = None
        # detach and free the chain just before llama_free(ctx), whoever closes the context
        # (the handle's pointer is already cleared then, so keep the raw one)
        ctx_ptr = self.ctx.ptr
        self.ctx.on_close(lambda: self._detach_backend_sampler(ctx_ptr))

    def _detach_backend_sampler(self, ctx_ptr: Optional[int] = None) -> None:
        chain, self._chain = self._chain, None
        self.backend_sampling_active = False
        if chain is None:
            return
        if ctx_ptr is None and not self.ctx.closed:
            ctx_ptr = self.ctx.ptr
        if ctx_ptr is not None:
            ll.llama_set_sampler(ctx_ptr, 0, None)
        ll.llama_sampler_free(chain)

    def _backend_failed(self, reason: str) -> None:
        """Backend results missing at run time: detach, fall back to CPU for good."""
        self._detach_backend_sampler()
        self.backend_sampling_reason = reason
        self.stats.backend_sampling_active = False
        _report_fallback(reason)

    def _top_token(self, i: int, with_prob: bool) -> tuple[int, float]:
        """Block row i's top candidate (ties: lowest id, identical on the backend and CPU paths) and,
        if with_prob, its probability under a softmax over the top CANDIDATES logits (else 1.0).

        Reads only what the decision needs: no candidate id array, no vocabulary-wide partition
        unless the probability is asked for (issue 17: nothing on the hot path nobody reads).
        """
        if self._chain is not None:
            ctx = self.ctx.ptr
            n_c = int(ll.llama_get_sampled_candidates_count_ith(ctx, i))
            ids_p = ll.llama_get_sampled_candidates_ith(ctx, i)
            lg_p = ll.llama_get_sampled_logits_ith(ctx, i)
            n_l = int(ll.llama_get_sampled_logits_count_ith(ctx, i)) if lg_p else 0
            if ids_p and lg_p and n_c > 0 and n_l == n_c:
                logits = float_view(lg_p, (n_c,))
                top = logits.max()
                best = np.flatnonzero(logits == top)
                tok = int(ids_p[int(best[0])]) if best.size == 1 else min(int(ids_p[int(j)]) for j in best)
                return tok, (float(1.0 / np.exp(logits - top).sum()) if with_prob else 1.0)
            self._backend_failed(f"no sampled candidates/logits for draft row {i} (count {n_c})")
            raise _RetryOnCpu()
        row = self._logits(i)
        tok = int(np.argmax(row))  # the first maximum: the lowest id among equal logits
        if not with_prob:
            return tok, 1.0
        cand = row[np.argpartition(row, -CANDIDATES)[-CANDIDATES:]]
        return tok, float(1.0 / np.exp(cand - row[tok]).sum())

    def _clamp_n_max(self, n_max: int) -> int:
        limit = self.info.max_draft_tokens
        if n_max <= limit:
            return n_max
        if not is_default(n_max):  # the default was not asked for: the block's limit, silently
            warnings.warn(
                f"draft_n_max={n_max} exceeds what the draft's block (block_size {self.info.block_size}) "
                f"can yield; clamped to {limit}",
                stacklevel=3,
            )
        return limit

    def close(self) -> None:
        if getattr(self, "ctx", None) is not None:
            self._detach_backend_sampler()
        for owner in ("inject_batch", "ctx"):
            h = getattr(self, owner, None)
            if h is not None:
                h.close()
        self.model.close()

    # ---- the three operations the loop drives -------------------------------------------------
    def inject(self, features: np.ndarray, pos0: int) -> None:
        """Queue target features for positions pos0.. for the draft KV cache.

        They are written in one batched decode when the draft is next used (or a batch fills up):
        while the adaptive controller decodes ordinarily, one draft decode per token would cost
        several percent of the step for nothing.  `features` must not be modified afterwards.
        """
        self._pending.append((features, pos0))
        self._pending_rows += features.shape[0]
        if self._pending_rows >= self._chunk:
            self.flush()

    def flush(self) -> None:
        """Write every queued feature row into the draft KV cache (no outputs)."""
        if not self._pending:
            return
        t0 = time.perf_counter()
        self.inject_batch.ptr  # RuntimeError once closed (the cached pointer below would dangle)
        ll.llama_batch_ext_clear(self._inject_ptr)
        # one llama_embd struct whose data pointer is rewritten per row: building a ctypes pointer
        # per row (ctypes.cast) cost more than the two llama.cpp calls that add the row
        emb, data, bptr, pa = self._embd, self._embd_data, self._inject_ptr, self._inject_pos
        add, set_pos = ll.llama_batch_ext_add_embd, ll.llama_batch_ext_set_pos
        chunk = self._chunk
        count, first, top = 0, 0, -1
        for features, pos0 in self._pending:
            emb.n_embd = features.shape[1]
            base, stride = _address(features), features.strides[0]
            for i in range(features.shape[0]):
                if count == chunk:
                    self._process_injection(first, count, top + 1)
                    ll.llama_batch_ext_clear(bptr)
                    count = 0
                p = pos0 + i
                data.value = base + i * stride
                idx = add(bptr, 0, emb)
                if idx < 0:
                    self._drop_pending()
                    raise LlamaCallError(f"llama_batch_ext_add_embd failed ({idx}) at position {p}")
                pa[0] = pa[1] = pa[2] = p
                set_pos(bptr, idx, pa)
                if count == 0:
                    first = p
                if p > top:
                    top = p
                count += 1
        if count:
            self._process_injection(first, count, top + 1)
        self._drop_pending()
        self.stats.process_seconds += time.perf_counter() - t0

    def _drop_pending(self) -> None:
        self._pending.clear()
        self._pending_rows = 0

    def _process_injection(self, pos: int, n_rows: int, end: int) -> None:
        """Decode the injection batch: n_rows rows from position pos on, none at end or beyond."""
        known, self._cache_end = self._cache_end, None
        self.inject_batch.n = n_rows
        rc = ll.llama_process(self.ctx.ptr, ll.LLAMA_PROCESS_TYPE_DECODE, self._inject_ptr)
        if rc != 0:
            self._drop_pending()
            raise LlamaCallError(f"draft feature injection at position {pos} failed (rc {rc})")
        if known is not None:
            self._cache_end = max(known, end)

    def block_tokens(self, n_past: int) -> int:
        """Rows of the block decoded at n_past: n_max (+1 for the anchor), as llama.cpp decodes it.

        The block is shortened only when the context ends first (its cells must exist).  See
        BLOCK SEMANTICS at the top of this module for why it is not shortened to the tokens asked for.
        """
        full = self.n_max + (0 if self.anchor_first else 1)
        return max(0, min(full, self.info.block_size, self.target.n_ctx - n_past))

    def begin(self, prompt: Sequence[int]) -> None:
        """Nothing to do: the draft learns the prompt from the features injected during prefill.

        (A generation starts with what the cache holds unknown: a caller may have loaded a state.)"""
        self._cache_end = None

    def accept(self, n_accepted: int) -> None:
        """Nothing to do: accepted rows reach the draft as injected features."""

    def propose(self, id_last: int, n_past: int, n: int, *, shadow: bool = False,
                history: Sequence[int] = ()) -> list[int]:
        """Draft up to n tokens following id_last (which sits at position n_past).

        `shadow`: for a probe that is scored against ordinary decoding, not verified; its tokens
        count as `shadow_drafted`, not `drafted` (its time counts as drafting all the same).

        The block is decoded at its full length (`block_tokens`) whatever n is; the filters and
        n_min apply to the full block's tokens, then the result is cut to n (llama.cpp's order).
        """
        n = min(n, self.n_max)
        if n <= 0:
            return []
        n_block = self.block_tokens(n_past)
        if n_block < (1 if self.anchor_first else 2):
            return []
        self.flush()
        t0 = time.perf_counter()
        # guard: a block longer than dflash.block_size makes llama.cpp skip the DSpark Markov head
        # silently (and DFlash2 lattice rows stop at block_size)
        assert n_block <= self.info.block_size
        tokens: list[int] = []
        self._cache_end = None  # the block's cells are written past it
        try:
            try:
                tokens = self._draft_block(id_last, n_past, n_block)
            except _RetryOnCpu:
                self.ctx.seq_rm(0, n_past, -1)
                tokens = self._draft_block(id_last, n_past, n_block)
        finally:
            # keep only the injected features: the block's own K/V must not stay in the cache
            self._cache_end = n_past if self.ctx.seq_rm(0, n_past, -1) else None
        if len(tokens) < self.n_min:
            tokens = []
        tokens = tokens[:n]
        self.stats.draft_seconds += time.perf_counter() - t0
        self.stats.draft_steps += 1
        if shadow:
            self.stats.shadow_drafted += len(tokens)
        else:
            self.stats.drafted += len(tokens)
        return tokens

    def _draft_block(self, id_last: int, n_past: int, n_block: int) -> list[int]:
        """Decode `[id_last, MASK...]` (n_block rows) and read the draft tokens off its slots.

        DFlash (and DSpark with sample_from_anchor false) reads slots 1..n_block-1, anchor-first
        DSpark reads 0..n_block-1.  The draft token of a slot is its top candidate (ties: lowest
        id, identical on the backend and CPU paths).  Filters, as llama.cpp's driver: DSpark with
        p_min > 0 stops at the first slot whose confidence is below p_min; DFlash stops at the first
        slot whose top-1 probability over the candidates is below p_min.  DFlash2 decodes without
        logits and walks its selector lattice (`selector_walk`).
        """
        # Every row stays an output, the anchor's too though DFlash never reads it (issue 17 item 3):
        # llama.cpp's dflash graph runs the LM head on every block row whatever the output flags
        # say (no out_ids selection) and copies the FIRST n_outputs rows out, so an anchor without
        # output would shift every mask slot's logits by one row -- wrong tokens, nothing saved.
        # DFlash2 reads its lattice (one row per token, unmasked) and asks for no logits at all.
        self.batch.set_block(id_last, self.mask, n_block, n_past, outputs=not self.info.is_dflash2)
        rc = self.batch.decode(self.ctx.ptr)
        if rc != 0:
            raise LlamaCallError(f"draft block decode at position {n_past} failed (rc {rc})")
        if self.info.is_dflash2:
            lattice = ext.llama_get_embeddings_nextn(self.ctx.ptr)
            if not lattice:
                raise LlamaCallError("the DFlash2 draft produced no selector lattice (llama_get_embeddings_nextn)")
            return selector_walk(float_view(lattice, (n_block, self.n_embd)), self.selector_top_k, self.p_min)
        first = 0 if self.anchor_first else 1
        conf = None
        dspark = self.info.algorithm == "dspark"
        if dspark and self.p_min > 0:
            # a NULL pointer (falsy, never None, from ctypes) means no confidences: llama.cpp's
            # driver then drafts without the filter, and so do we
            conf = ext.llama_get_embeddings_nextn(self.ctx.ptr) or None
        with_prob = not dspark and self.p_min > 0
        if conf is None and not with_prob and self._chain is None:
            # no filter: every slot's top token, in one numpy call over the block's rows
            # (argmax takes the first maximum: the lowest id among equal logits)
            return self._block_rows(n_block)[first:].argmax(axis=1).tolist()
        tokens: list[int] = []
        for i in range(first, n_block):
            # strict `<` as llama.cpp: p_min 1.0 keeps slots whose confidence/probability is exactly 1.0
            if conf is not None and conf[i * self.n_embd] < self.p_min:
                break
            tok, prob = self._top_token(i, with_prob)
            if prob < self.p_min:
                break
            tokens.append(tok)
        return tokens

    def rollback(self, n_past: int) -> None:
        for f, p0 in self._pending:
            if p0 + f.shape[0] > n_past:  # some queued row is at n_past or beyond: cut the queue
                kept = [(f[: n_past - p0], p0) for f, p0 in self._pending if p0 < n_past]
                self._pending = kept
                self._pending_rows = sum(f.shape[0] for f, _ in kept)
                break
        end = self._cache_end
        if end is not None and n_past >= end:
            return  # nothing at n_past or beyond is in the cache (see _cache_end)
        self._cache_end = n_past if self.ctx.seq_rm(0, n_past, -1) else None

    def clear(self) -> None:
        self._drop_pending()
        self.ctx.clear()
        self._cache_end = None  # empty now, but a caller may load a state into it next

    def pos_max(self) -> int:
        """Last position in the draft KV cache (queued features written first)."""
        self.flush()
        return self.ctx.pos_max(0)

    def _logits(self, i: int) -> np.ndarray:
        ptr = logits_ith_addr(self.ctx.ptr, i)
        if not ptr:
            raise LlamaCallError(f"draft produced no logits for block row {i}")
        return float_view(ptr, (self.n_vocab,))

    def _block_rows(self, n_block: int) -> np.ndarray:
        """The block's logits, [n_block, n_vocab] (every row is an output, in batch order)."""
        ptr = logits_addr(self.ctx.ptr)
        if not ptr:
            raise LlamaCallError("the draft block produced no logits")
        return float_view(ptr, (n_block, self.n_vocab))


def selector_walk(lattice: np.ndarray, top_k: int, p_min: float = 0.0) -> list[int]:
    """The DFlash2 draft tokens of one block: a greedy walk over its selector lattice.

    `lattice` has one row per block slot (slot 0, the anchor, is not read).  Row i starts with the
    ids of slot i's top_k candidates (as floats), then top_k x top_k scores, predecessor-major:
    entry [p][j] scores candidate j of slot i after candidate p of slot i-1 (slot 1's predecessor
    is the anchor, so its rows are all alike).  Each slot takes the best successor of the previous
    slot's choice (first maximum on ties); with p_min > 0 the walk stops at the first slot whose
    choice has a softmax over those top_k scores below p_min.  llama.cpp's driver walks the same
    lattice the same way (common/speculative.cpp).
    """
    tokens: list[int] = []
    pred = 0
    for i in range(1, lattice.shape[0]):
        row = lattice[i]
        scores = row[top_k + pred * top_k : top_k + (pred + 1) * top_k]
        pred = int(np.argmax(scores))
        if p_min > 0.0 and 1.0 / float(np.exp(scores - scores[pred]).sum(dtype=np.float32)) < p_min:
            break
        tokens.append(int(row[pred]))
    return tokens


def _address(features: np.ndarray) -> int:
    """The address of a C-contiguous array's first element.

    ndarray.ctypes builds a helper object (an import and a class instance, ~2 us); a ctypes view
    of the buffer costs a sixth of that.  Read-only arrays cannot be viewed that way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(features))
    except (TypeError, ValueError, BufferError):
        return features.ctypes.data


class _RetryOnCpu(Exception):
    """The backend sampler gave no results: redo the block on the CPU path."""
