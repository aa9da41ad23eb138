"""Autoregressive drafts for every sequence of a `BatchedEngine`: a classic draft model
(draft-simple) and an EAGLE-3 head (draft-eagle3).

One draft context holds a stream per slot (seq ids = the engine's slots), as llama.cpp's
`common_speculative_impl_draft_simple/_eagle3` hold `n_seq` sequences for `llama-server -np N`:

  - rows: after a target decode, each sequence's committed rows (tokens, and for EAGLE-3 the
    features of the head's target layers) are queued for its stream and written in one decode of
    all sequences just before the draft is next used (`flush`);
  - drafting: every drafting sequence's first row goes into ONE decode, then one decode per draft
    position holds the next token of each sequence still drafting, at its own positions in its
    own stream, as llama.cpp's loop does; the drafted cells are removed right after;
  - per sequence, the single-sequence semantics of `proposers.simple` / `proposers.eagle3`: the
    top candidate of a top-10 sampler, p_min per position, n_min; EAGLE-3's cache entry at P is
    (t_{P+1}, g_P), so the last row of each sequence waits for its next token (the deferred
    boundary) and a rollback to n keeps g_{n-1} for it.

llama.cpp returns logits and hidden rows in batch order, so rows are read by their batch index.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from .. import _bindings as ext
from .._batch import logits_addr
from .._llama import BatchExt, Context, Model
from ..config import SpecConfig
from ..draft_models import Eagle3Info, SimpleDraftInfo, check_vocab_compatible
from ..errors import IncompatibleModelError, LlamaCallError
from ..proposers.simple import DEFAULT_AR_N_MAX
from ..proposers.topk import top_candidate
from ..rewind import is_recurrent_model
from ..target import float_view
from .draft import Block
from .prompt_cache import load_seq_state, save_seq_state

__all__ = ["BatchedSimpleDraft", "BatchedEagle3Draft", "SlotState"]

_KEEP_ROWS = 512  # EAGLE-3 g rows kept per slot behind its newest


@dataclass
class SlotState:
    """A slot's draft state for the engine's prompt cache: its cells, and what the draft keeps
    beyond them (`end`; an EAGLE-3 head's g rows from position g0)."""

    cells: "ctypes.Array[ctypes.c_ubyte]"
    end: int
    g: Optional[np.ndarray] = None
    g0: int = 0

    def __len__(self) -> int:  # bytes held (the prompt cache's accounting)
        return len(self.cells) + (self.g.nbytes if self.g is not None else 0)


class _BatchedAR:
    """What both kinds share: the context, the batches, the step loop over sequences."""

    kind = ""

    def _setup(self, spec: SpecConfig, model: Model, target_ctx: Context, n_seq: int, n_ctx_seq: int,
               n_threads: int, *, other: bool) -> None:
        self.n_seq = n_seq
        self.model = model
        self.ctx: Optional[Context] = None
        self.batch: Optional[BatchExt] = None
        params = ll.llama_context_default_params()
        params.n_seq_max = n_seq
        params.kv_unified = False  # one stream per slot, as the target's
        params.n_ctx = n_ctx_seq * n_seq
        params.n_batch = target_ctx.n_batch
        params.n_ubatch = target_ctx.n_ubatch
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        self.ctx = Context(model, params, other=target_ctx if other else None)
        self.batch = BatchExt(self.ctx)
        self.n_max = DEFAULT_AR_N_MAX if spec.adaptive else int(spec.draft_n_max)
        self.n_min = min(spec.draft_n_min, self.n_max)
        self.p_min = spec.draft_p_min
        self.n_vocab = model.n_vocab
        self.n_vocab_target = target_ctx.model.n_vocab  # a draft token beyond it cannot be verified
        self.end = [0] * n_seq  # per slot: its cells hold positions < end
        self.draft_seconds = 0.0
        self.inject_seconds = 0.0
        self.blocks = 0

    def close(self) -> None:
        for owner in ("batch", "enc_batch", "ctx"):
            h = getattr(self, owner, None)
            if h is not None:
                h.close()
        self.model.close()

    def fits(self, pos: int, n_ctx_seq: int) -> bool:
        """Whether a draft at `pos` fits the slot (its cells must exist)."""
        return pos + self.n_max <= n_ctx_seq

    def _cut(self, sid: int, pos: int) -> None:
        self.ctx.seq_rm(sid, max(0, pos), -1)
        self.end[sid] = min(self.end[sid], max(0, pos))

    def save_slot(self, sid: int) -> Optional[SlotState]:
        """The slot's draft state for the prompt cache (queued rows written first)."""
        self.flush()
        cells = save_seq_state(self.ctx.ptr, sid)
        return None if cells is None else SlotState(cells, self.end[sid])

    def load_slot(self, sid: int, saved: SlotState) -> bool:
        if not load_seq_state(self.ctx.ptr, sid, saved.cells):
            self.truncate(sid, 0)
            return False
        self.end[sid] = saved.end
        return True

    def _loop(self, blocks: Sequence[Block], first_rows: list[tuple[int, int, int]], want: dict[int, int],
              embd_of_row=None) -> dict[int, list[int]]:
        """The drafting loop over sequences: `first_rows` (block index, token, position) are
        decoded first; each output row's top candidate continues its sequence at the next
        position until it fails p_min, the target's vocabulary, or reaches `want[block index]`."""
        b = self.batch
        out: dict[int, list[int]] = {j: [] for j, _, _ in first_rows}
        rows = first_rows
        with_prob = self.p_min > 0.0
        while rows:
            b.clear()
            for j, tok, pos in rows:
                idx = b.add_token(tok, pos, True, blocks[j].seq_id)
                if embd_of_row is not None:
                    embd_of_row(idx, j)
            rc = b.process()
            if rc != 0:
                raise LlamaCallError(f"draft decode of {len(rows)} sequences failed (llama_process returned {rc})")
            ptr = logits_addr(self.ctx.ptr)
            if not ptr:
                raise LlamaCallError("the draft produced no logits")
            logits = float_view(ptr, (len(rows), self.n_vocab))
            nxt = []
            for i, (j, _, pos) in enumerate(rows):
                tok, prob = top_candidate(logits[i], with_prob)
                if prob < self.p_min or tok >= self.n_vocab_target:
                    continue
                out[j].append(tok)
                if len(out[j]) < want[j]:
                    nxt.append((j, tok, pos + 1))
                    self._carry(i, j)
            rows = nxt
        return out

    def _carry(self, i: int, j: int) -> None:
        """Keep what row i (of block j) hands to its next position (EAGLE-3: its hidden row)."""


class BatchedSimpleDraft(_BatchedAR):
    """A classic draft model for all slots (see the module docstring).  One owner: the engine."""

    kind = "draft-simple"

    def __init__(self, info: SimpleDraftInfo, spec: SpecConfig, target_model: Model, target_ctx: Context, *,
                 n_seq: int, n_ctx_seq: int, n_threads: int, n_gpu_layers: int):
        self.info = info
        model = Model(info.path, n_gpu_layers=spec.draft_gpu_layers(n_gpu_layers), repack=target_model.repack)
        self.model = model
        try:
            if is_recurrent_model(model):
                raise IncompatibleModelError(
                    info.path, "general.architecture", info.gguf.architecture,
                    "an attention-only draft model for draft-simple (a recurrent or hybrid draft's state cannot be "
                    "cut back after a rejected draft)")
            check_vocab_compatible(target_model.vocab, model.vocab, info.path, "the target")
            self._setup(spec, model, target_ctx, n_seq, n_ctx_seq, n_threads, other=False)
        except BaseException:
            self.close()
            raise
        self._pending: list[tuple[int, int, np.ndarray]] = []  # (slot, first position, tokens)

    def inject(self, seq_id: int, pos0: int, features: np.ndarray, tokens: Sequence[int] = ()) -> None:
        """Queue the committed rows' tokens at pos0.. of a slot (`features` unused)."""
        if len(tokens):
            self._pending.append((seq_id, pos0, np.asarray(tokens, dtype=np.int32)))

    def flush(self) -> None:
        """Write every queued row into its stream, in decodes of up to n_batch rows."""
        if not self._pending:
            return
        t0 = time.perf_counter()
        b, cap = self.batch, self.ctx.n_batch
        pending, self._pending = self._pending, []
        try:
            b.clear()
            for sid, pos0, toks in pending:
                if pos0 > self.end[sid]:
                    continue  # a hole before these rows (a slot emptied meanwhile): the next request starts over
                if pos0 < self.end[sid]:
                    if b.n:
                        self._process()
                    self._cut(sid, pos0)
                for i, tok in enumerate(toks):
                    if b.n == cap:
                        self._process()
                    b.add_token(int(tok), pos0 + i, False, sid)
                self.end[sid] = pos0 + len(toks)
            if b.n:
                self._process()
        finally:
            self.inject_seconds += time.perf_counter() - t0

    def _process(self) -> None:
        rc = self.batch.process()
        self.batch.clear()
        if rc != 0:
            raise LlamaCallError(f"draft decode of the committed rows failed (llama_process returned {rc})")

    def truncate(self, seq_id: int, n_keep: int) -> None:
        """Keep positions < n_keep of a slot (queued rows included)."""
        self._pending = [(s, p0, t[: max(0, n_keep - p0)] if s == seq_id else t) for s, p0, t in self._pending
                         if s != seq_id or p0 < n_keep]
        self._cut(seq_id, n_keep)

    def resume_point(self, seq_id: int, n_keep: int) -> int:
        """The longest prefix <= n_keep the slot's draft can resume from: the tokens its cells hold."""
        self.flush()
        return min(n_keep, self.end[seq_id])

    def propose(self, blocks: Sequence[Block]) -> None:
        """Fill every block's `tokens` (the engine's `Block`; `n` caps a block, as the step's budget
        caps llama.cpp's draft-simple)."""
        if not blocks:
            return
        self.flush()
        t0 = time.perf_counter()
        first, want = [], {}
        for j, blk in enumerate(blocks):
            blk.tokens = []
            if self.end[blk.seq_id] < blk.pos:
                continue  # the slot's draft lacks rows
            self._cut(blk.seq_id, blk.pos)
            want[j] = min(self.n_max, blk.n if blk.n else self.n_max)
            if want[j] > 0:
                first.append((j, blk.id_last, blk.pos))
        try:
            out = self._loop(blocks, first, want)
            for j, toks in out.items():
                blocks[j].tokens = [] if len(toks) < self.n_min else toks
        finally:
            for blk in blocks:
                self._cut(blk.seq_id, blk.pos)  # the drafted cells (and id_last's) go
            self.draft_seconds += time.perf_counter() - t0
            self.blocks += 1


class BatchedEagle3Draft(_BatchedAR):
    """An EAGLE-3 head for all slots (see the module docstring).  One owner: the engine."""

    kind = "draft-eagle3"

    def __init__(self, info: Eagle3Info, spec: SpecConfig, target_model: Model, target_ctx: Context, *,
                 n_seq: int, n_ctx_seq: int, n_threads: int, n_gpu_layers: int):
        self.info = info
        self.model = Model(info.path, n_gpu_layers=spec.draft_gpu_layers(n_gpu_layers), repack=target_model.repack)
        self.enc_batch: Optional[BatchExt] = None
        try:
            self._setup(spec, self.model, target_ctx, n_seq, n_ctx_seq, n_threads, other=True)
            self.enc_batch = BatchExt(self.ctx)
        except BaseException:
            self.close()
            raise
        ext.llama_set_embeddings_nextn(self.ctx.ptr, True, True)
        self.n_embd = self.model.n_embd
        self._chunk = self.ctx.n_ubatch
        self._embd = ll.llama_embd(None, 1, 0)
        self._embd_data = ctypes.c_void_p.from_buffer(self._embd, ll.llama_embd.data.offset)
        self._pending: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # (slot, pos0, tokens, features)
        self._g: list[np.ndarray] = [np.zeros((0, self.n_embd), np.float32) for _ in range(n_seq)]
        self._g0 = [0] * n_seq
        self._rows = np.zeros((0, self.n_embd), np.float32)  # the draft loop's input rows

    # ---- rows ----------------------------------------------------------------------------------
    def inject(self, seq_id: int, pos0: int, features: np.ndarray, tokens: Sequence[int] = ()) -> None:
        """Queue the committed rows (tokens and the head's target-layer features) at pos0.."""
        if features.shape[0]:
            self._pending.append((seq_id, pos0, np.asarray(tokens, dtype=np.int32),
                                  np.ascontiguousarray(features, dtype=np.float32)))

    def flush(self) -> None:
        """Encode the queued rows and write every decoder row whose next token is known."""
        if not self._pending:
            return
        t0 = time.perf_counter()
        pending, self._pending = self._pending, []
        try:
            rows = []  # (slot, position, token, g address)
            keep = []
            for sid, pos0, toks, feats in pending:
                n = len(toks)
                if pos0 - 1 > self.end[sid]:
                    continue  # a hole before these rows (a slot emptied meanwhile): the next request starts over
                g = self._encode(sid, feats)
                keep.append(g)  # the rows below point into these arrays until they are decoded
                start = max(self.end[sid], pos0 - 1, 0)
                if start <= pos0 + n - 2:
                    if start < pos0 and not self._knows(sid, start):
                        raise LlamaCallError(f"the EAGLE-3 head lost the target features of slot {sid} at {start}")
                    self.ctx.seq_rm(sid, start, -1)
                    for p in range(start, pos0 + n - 1):
                        if p >= pos0:
                            addr = g.ctypes.data + (p - pos0) * g.strides[0]
                        else:  # the deferred boundary: a copy (the slot's g rows are replaced below)
                            row = self._g[sid][p - self._g0[sid]].copy()
                            keep.append(row)
                            addr = row.ctypes.data
                        rows.append((sid, p, int(toks[p + 1 - pos0]), addr))
                    self.end[sid] = pos0 + n - 1
                self._remember(sid, g, pos0)
            self._decode_rows(rows)
        finally:
            self.inject_seconds += time.perf_counter() - t0

    def _encode(self, sid: int, features: np.ndarray) -> np.ndarray:
        n = features.shape[0]
        g = np.empty((n, self.n_embd), dtype=np.float32)
        b, emb, data = self.enc_batch, self._embd, self._embd_data
        emb.n_embd = features.shape[1]
        base, stride = features.ctypes.data, features.strides[0]
        for s in range(0, n, self._chunk):
            m = min(self._chunk, n - s)
            b.clear()
            pos = self.ctx.pos_max(sid) + 1  # placeholders that continue the slot's cells (unread)
            for i in range(s, s + m):
                data.value = base + i * stride
                b.add_embd(emb, pos + i - s, sid)
            rc = int(ll.llama_process(self.ctx.ptr, ll.LLAMA_PROCESS_TYPE_ENCODE, b.ptr))
            if rc != 0:
                raise LlamaCallError(f"EAGLE-3 encoder failed on {m} rows of slot {sid} (rc {rc})")
            ptr = ext.llama_get_embeddings_nextn(self.ctx.ptr)
            if not ptr:
                raise LlamaCallError("the EAGLE-3 encoder produced no output (llama_get_embeddings_nextn)")
            g[s:s + m] = float_view(ptr, (m, self.n_embd))
        return g

    def _decode_rows(self, rows: list[tuple[int, int, int, int]]) -> None:
        b, emb, data, cap = self.batch, self._embd, self._embd_data, self.ctx.n_batch
        emb.n_embd = self.n_embd
        b.clear()
        for sid, p, tok, addr in rows:
            if b.n == cap:
                self._process_rows()
            idx = b.add_token(tok, p, False, sid)
            data.value = addr
            if not ll.llama_batch_ext_set_embd_token(b.ptr, idx, emb):
                raise LlamaCallError(f"llama_batch_ext_set_embd_token failed at position {p} of slot {sid}")
        if b.n:
            self._process_rows()

    def _process_rows(self) -> None:
        rc = self.batch.process()
        self.batch.clear()
        if rc != 0:
            raise LlamaCallError(f"EAGLE-3 decoder failed on the committed rows (llama_process returned {rc})")

    def _remember(self, sid: int, g: np.ndarray, pos0: int) -> None:
        old, g0 = self._g[sid], self._g0[sid]
        if len(old) and g0 <= pos0 <= g0 + len(old):
            rows = np.concatenate([old[: pos0 - g0], g])
        else:
            rows, g0 = g, pos0
        if len(rows) > _KEEP_ROWS:
            g0 += len(rows) - _KEEP_ROWS
            rows = rows[-_KEEP_ROWS:]
        self._g[sid], self._g0[sid] = np.ascontiguousarray(rows), g0

    def _knows(self, sid: int, pos: int) -> bool:
        return self._g0[sid] <= pos < self._g0[sid] + len(self._g[sid])

    def truncate(self, seq_id: int, n_keep: int) -> None:
        """Keep what positions < n_keep determine: rows < n_keep-1 and g_{n_keep-1} (the boundary)."""
        self._pending = [(s, p0, t[: max(0, n_keep - p0)] if s == seq_id else t,
                          f[: max(0, n_keep - p0)] if s == seq_id else f)
                         for s, p0, t, f in self._pending if s != seq_id or p0 < n_keep]
        self._cut(seq_id, n_keep - 1)
        g, g0 = self._g[seq_id], self._g0[seq_id]
        if g0 + len(g) > n_keep:
            self._g[seq_id] = g[: max(0, n_keep - g0)]

    def resume_point(self, seq_id: int, n_keep: int) -> int:
        """The longest prefix <= n_keep the head can resume from: its rows before the last
        position are written and the last position's g is kept (else 0: from scratch)."""
        self.flush()
        if n_keep <= 0:
            return 0
        n = min(n_keep, self.end[seq_id] + 1, self._g0[seq_id] + len(self._g[seq_id]))
        return n if n >= 1 and self._knows(seq_id, n - 1) else 0

    def save_slot(self, sid: int) -> Optional[SlotState]:
        saved = super().save_slot(sid)
        if saved is not None:
            saved.g, saved.g0 = self._g[sid].copy(), self._g0[sid]
        return saved

    def load_slot(self, sid: int, saved: SlotState) -> bool:
        if not super().load_slot(sid, saved):
            return False
        self._g[sid] = saved.g.copy() if saved.g is not None else np.zeros((0, self.n_embd), np.float32)
        self._g0[sid] = saved.g0
        return True

    # ---- drafting ------------------------------------------------------------------------------
    def propose(self, blocks: Sequence[Block]) -> None:
        """Fill every block's `tokens`: each sequence's first decoder row pairs id_last with the
        boundary g at pos-1; later rows pair each drafted token with the row before's hidden state."""
        if not blocks:
            return
        self.flush()
        t0 = time.perf_counter()
        first, want = [], {}
        self._rows = np.zeros((len(blocks), self.n_embd), np.float32)
        for j, blk in enumerate(blocks):
            blk.tokens = []
            sid, pos = blk.seq_id, blk.pos - 1
            if pos < 0 or self.end[sid] < pos or not self._knows(sid, pos):
                continue
            self._rows[j] = self._g[sid][pos - self._g0[sid]]
            self._cut(sid, pos)
            n = blk.n if blk.n else self.n_max
            want[j] = min(self.n_max, max(n, self.n_min))
            first.append((j, blk.id_last, pos))
        try:
            out = self._loop(blocks, first, want, self._set_row)
            for j, toks in out.items():
                blk = blocks[j]
                blk.tokens = [] if len(toks) < self.n_min else toks[: blk.n or None]
                self.end[blk.seq_id] = blk.pos  # the boundary row (id_last's) stays
        finally:
            for blk in blocks:
                self.ctx.seq_rm(blk.seq_id, blk.pos, -1)
                self.end[blk.seq_id] = min(self.end[blk.seq_id], blk.pos)
            self.draft_seconds += time.perf_counter() - t0
            self.blocks += 1

    def _set_row(self, idx: int, j: int) -> None:
        emb, data = self._embd, self._embd_data
        emb.n_embd = self.n_embd
        data.value = self._rows.ctypes.data + j * self._rows.strides[0]
        if not ll.llama_batch_ext_set_embd_token(self.batch.ptr, idx, emb):
            raise LlamaCallError("llama_batch_ext_set_embd_token failed for a draft row")

    def _carry(self, i: int, j: int) -> None:
        h = ext.llama_get_embeddings_nextn_ith(self.ctx.ptr, i)
        if not h:
            raise LlamaCallError("the EAGLE-3 decoder produced no hidden state (llama_get_embeddings_nextn_ith)")
        self._rows[j] = float_view(h, (self.n_embd,))
