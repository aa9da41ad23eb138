"""The trained autoregressive drafts run by llama.cpp itself, for parity with the PyTorch models.

`Eagle3Reference` drives an `eagle3` GGUF the way `common_speculative_impl_draft_eagle3` does
(common/speculative.cpp): the encoder over target feature rows (`LLAMA_PROCESS_TYPE_ENCODE`, g
read back as the context's nextn embeddings), the decoder fed (t_{p+1}, g_p) pairs at positions
p < c and the seed (t_{c+1}, g_c) at c, then one row per draft token fed (d_i, pre-norm state of
the row before) at c + i, argmax of each row's logits. `SimpleReference` decodes a plain llama
draft teacher-forced and returns its argmax per row. Neither is the engine's proposer: they are
the smallest faithful drivers, so a training run can check what it exports before anything else
reads it.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from .. import _bindings as ext
from .._llama import BatchExt, Context, Model, set_verbose
from ..target import float_view

__all__ = ["Eagle3Reference", "SimpleReference"]


def _params(n_ctx: int, n_batch: int, n_threads: Optional[int]):
    p = ll.llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = p.n_ubatch = n_batch
    p.n_seq_max = 1
    if n_threads:
        p.n_threads = p.n_threads_batch = n_threads
    p.no_perf = True
    return p


class Eagle3Reference:
    """An EAGLE-3 draft GGUF on llama.cpp, attached to its target through ctx_other."""

    def __init__(self, target_path: str, draft_path: str, *, n_ctx: int = 512, n_threads: Optional[int] = None):
        set_verbose(False)
        self._handles = []
        self.target = Model(target_path, n_gpu_layers=0)
        self._handles.append(self.target)
        self.tctx = Context(self.target, _params(n_ctx, min(n_ctx, 512), n_threads))
        self._handles.append(self.tctx)
        self.model = Model(draft_path, n_gpu_layers=0)
        self._handles.append(self.model)
        self.ctx = Context(self.model, _params(n_ctx, min(n_ctx, 512), n_threads), other=self.tctx)
        self._handles.append(self.ctx)
        ext.llama_set_embeddings_nextn(self.ctx.ptr, True, True)
        self.batch = BatchExt(self.ctx)
        self._handles.append(self.batch)
        self.n_embd = self.model.n_embd
        self.n_vocab = self.model.n_vocab
        self.layers = ext.target_layer_ids(self.model.ptr)

    def close(self) -> None:
        for h in reversed(self._handles):
            h.close()
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _embd(self, rows: np.ndarray, i: int) -> "ll.llama_embd":
        return ll.llama_embd(rows[i:].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, rows.shape[1])

    def encode(self, features: np.ndarray) -> np.ndarray:
        """g rows [n, E] of target feature rows [n, 3 * target_hidden] (float32)."""
        f = np.ascontiguousarray(features, dtype=np.float32)
        out = []
        step = self.ctx.n_ubatch
        for a in range(0, len(f), step):
            chunk = f[a:a + step]
            self.batch.clear()
            pos0 = self.ctx.pos_max(0) + 1  # the encoder reads no position: placeholders after the cache, as the driver does
            for i in range(len(chunk)):
                idx = self.batch.add_embd(self._embd(chunk, i), pos0 + i)
                ll.llama_batch_ext_set_output_embd(self.batch.ptr, idx, True)
            rc = ll.llama_process(self.ctx.ptr, ll.LLAMA_PROCESS_TYPE_ENCODE, self.batch.ptr)
            if rc != 0:
                raise RuntimeError(f"eagle3 encoder failed (rc {rc})")
            g = ext.llama_get_embeddings_nextn(self.ctx.ptr)
            out.append(np.array(float_view(g, (len(chunk), self.n_embd))))
        return np.concatenate(out)

    def _decode(self, rows: Sequence[tuple[int, int, np.ndarray]], outputs: bool) -> None:
        """Decode (token, position, g row) pairs; outputs for the last row only when asked."""
        self.batch.clear()
        for n, (tok, pos, g) in enumerate(rows):
            idx = self.batch.add_token(int(tok), int(pos), outputs and n == len(rows) - 1)
            if not ll.llama_batch_ext_set_embd_token(self.batch.ptr, idx, self._embd(g[None], 0)):
                raise RuntimeError("llama_batch_ext_set_embd_token failed")
        rc = self.batch.process()
        if rc != 0:
            raise RuntimeError(f"eagle3 decoder failed (rc {rc})")

    def reset(self) -> None:
        """Forget the sequence `propose` has been following."""
        self.ctx.clear()
        self._written = 0  # positions < this hold correct (t_{p+1}, g_p) pairs
        self._g: list[np.ndarray] = []

    def propose(self, features: np.ndarray, tokens: Sequence[int], n_past: int, n: int) -> list[int]:
        """Incremental drafting along one sequence, as the C++ driver keeps its draft cache: the last
        verified token tokens[n_past] sits at n_past; the pairs of every position before n_past - 1
        are written once (their features `features[p]`, the tokens that followed), the seed at
        n_past - 1, then n draft rows. Calls must move forward along the same sequence (`reset`)."""
        if not hasattr(self, "_written"):
            self.reset()
        c = n_past - 1
        if c < self._written - 1 or c < 0:
            raise ValueError(f"propose at {n_past} after {self._written}: call reset() for another sequence")
        self.ctx.seq_rm(0, self._written, -1)  # the previous chain's draft rows
        have = sum(len(x) for x in self._g)
        if have < c + 1:
            self._g.append(self.encode(features[have:c + 1]))
        g = np.concatenate(self._g) if len(self._g) > 1 else self._g[0]
        self._g = [g]
        pairs = [(int(tokens[p + 1]), p, g[p]) for p in range(self._written, c)]
        step = self.ctx.n_ubatch
        for a in range(0, len(pairs), step):
            self._decode(pairs[a:a + step], outputs=False)
        keep, out = [], []
        row = (int(tokens[c + 1]), c, g[c])
        for i in range(n):
            self._decode([row], outputs=True)
            logits = float_view(ll.llama_get_logits_ith(self.ctx.ptr, -1), (self.n_vocab,))
            d = int(np.argmax(logits))
            h = np.array(float_view(ext.llama_get_embeddings_nextn_ith(self.ctx.ptr, -1), (self.n_embd,)))
            keep.append(h)
            out.append(d)
            row = (d, c + 1 + i, h)
        self._written = c + 1
        return out

    def chain(self, features: np.ndarray, tokens: Sequence[int], c: int, n: int) -> tuple[list[int], np.ndarray]:
        """n draft tokens from the seed (tokens[c + 1], g_c) at position c, as the C++ driver drafts
        them after a target decode whose features are `features` (rows 0..c), and the pre-norm
        state of each draft row [n, E] (from an empty cache: `propose` is the incremental form)."""
        self.reset()
        g = self.encode(features[: c + 1])
        keep = []  # numpy rows must outlive the batch that points at them
        step = self.ctx.n_ubatch
        pairs = [(int(tokens[p + 1]), p, g[p]) for p in range(c)]
        for a in range(0, len(pairs), step):
            self._decode(pairs[a:a + step], outputs=False)
        out = []
        row = (int(tokens[c + 1]), c, g[c])
        for i in range(n):
            self._decode([row], outputs=True)
            logits = float_view(ll.llama_get_logits_ith(self.ctx.ptr, -1), (self.n_vocab,))
            d = int(np.argmax(logits))
            h = np.array(float_view(ext.llama_get_embeddings_nextn_ith(self.ctx.ptr, -1), (self.n_embd,)))
            keep.append(h)
            out.append(d)
            row = (d, c + 1 + i, h)
        return out, np.stack(keep)


class SimpleReference:
    """A plain llama draft GGUF decoded teacher-forced: the argmax after every row."""

    def __init__(self, draft_path: str, *, n_ctx: int = 512, n_threads: Optional[int] = None):
        set_verbose(False)
        self.model = Model(draft_path, n_gpu_layers=0)
        self.ctx = Context(self.model, _params(n_ctx, min(n_ctx, 512), n_threads))
        self.batch = BatchExt(self.ctx)
        self.n_vocab = self.model.n_vocab

    def close(self) -> None:
        for h in (self.batch, self.ctx, self.model):
            h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset(self) -> None:
        """Forget the sequence `propose` has been following."""
        self.ctx.clear()
        self._written = 0  # the cache holds the tokens of positions < this

    def propose(self, tokens: Sequence[int], n_past: int, n: int) -> list[int]:
        """n greedy draft tokens after tokens[n_past] (the last verified token, at n_past), as the C++
        driver keeps a classic draft's cache: the verified tokens not in it yet are decoded, then
        the drafted ones, whose cells go again.  Calls move forward along one sequence (`reset`)."""
        if not hasattr(self, "_written"):
            self.reset()
        if n_past < self._written:
            raise ValueError(f"propose at {n_past} after {self._written}: call reset() for another sequence")
        self.ctx.seq_rm(0, self._written, -1)  # the previous draft's cells
        todo = [int(t) for t in tokens[self._written:n_past + 1]]
        step = self.ctx.n_ubatch
        for a in range(0, len(todo), step):
            chunk = todo[a:a + step]
            self.batch.clear()
            for i, t in enumerate(chunk):
                self.batch.add_token(t, self._written + a + i, a + i == len(todo) - 1)
            if self.batch.process() != 0:
                raise RuntimeError("draft decode failed")
        self._written = n_past + 1
        out: list[int] = []
        for i in range(n):
            d = int(np.argmax(float_view(ll.llama_get_logits_ith(self.ctx.ptr, -1), (self.n_vocab,))))
            out.append(d)
            if i + 1 < n:
                self.batch.clear()
                self.batch.add_token(d, n_past + 1 + i, True)
                if self.batch.process() != 0:
                    raise RuntimeError("draft decode failed")
        return out

    def argmax(self, tokens: Sequence[int]) -> list[int]:
        """The draft's greedy next token after each of `tokens` (decoded from position 0)."""
        self.ctx.clear()
        out = []
        step = self.ctx.n_ubatch
        for a in range(0, len(tokens), step):
            chunk = tokens[a:a + step]
            self.batch.clear()
            for i, t in enumerate(chunk):
                self.batch.add_token(int(t), a + i, True)
            rc = self.batch.process()
            if rc != 0:
                raise RuntimeError(f"draft decode failed (rc {rc})")
            for i in range(len(chunk)):
                out.append(int(np.argmax(float_view(ll.llama_get_logits_ith(self.ctx.ptr, i), (self.n_vocab,)))))
        return out
