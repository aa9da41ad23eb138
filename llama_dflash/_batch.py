"""The hot path's C calls: token batches filled by numpy, output buffers read by address.

A speculative step on a fast device lasts about a millisecond, so what Python does around
llama.cpp shows (issue 28).  Building a `llama_batch_ext` costs three C calls per token (add,
set position, set output): 27 us for a 5-row verify batch, where filling the arrays of a plain
`llama_batch` with numpy and calling `llama_decode` once costs 3 us.  llama.cpp turns such a batch
into the same `llama_batch_ext` inside (llama_batch_compat), so what it decodes is identical.
Feature injection keeps `BatchExt`: its rows are wider than the draft's token embeddings, which
only the ext API can say.

The logits getters here return addresses (ints) instead of ctypes pointers, so that a numpy view
is found without a `ctypes.cast` per row.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

__all__ = ["TokenBatch", "logits_addr", "logits_ith_addr"]


def _addr_function(name: str, argtypes: list) -> "ctypes._CFuncPtr":
    # a fresh function object (CDLL item access does not cache): llama-cpp-python's own binding of
    # the same symbol keeps its pointer restype
    fn = ll._lib[name]
    fn.argtypes = argtypes
    fn.restype = ctypes.c_void_p
    return fn


#: float * llama_get_logits(ctx) as an address (None: no logits)
logits_addr = _addr_function("llama_get_logits", [ctypes.c_void_p])
#: float * llama_get_logits_ith(ctx, i) as an address (None: no logits for row i)
logits_ith_addr = _addr_function("llama_get_logits_ith", [ctypes.c_void_p, ctypes.c_int32])


class TokenBatch:
    """Up to `n_max` token rows of one sequence, decoded with one `llama_decode` call.

    The arrays belong to this object (numpy), not to llama.cpp, so there is nothing to free.
    """

    def __init__(self, n_max: int, seq_id: int = 0):
        if n_max <= 0:
            raise ValueError(f"a batch needs room for at least one token, not {n_max}")
        self.n_max = int(n_max)
        self.token = np.zeros(n_max, dtype=np.int32)
        self.pos = np.zeros(n_max, dtype=np.int32)
        self.n_seq_id = np.ones(n_max, dtype=np.int32)
        self.seq_id = np.full(n_max, seq_id, dtype=np.int32)
        self.logits = np.zeros(n_max, dtype=np.int8)
        self._ramp = np.arange(n_max, dtype=np.int32)
        # llama_batch.seq_id is one pointer per row to that row's seq ids: here into self.seq_id
        base, step = self.seq_id.ctypes.data, self.seq_id.itemsize
        self._seq_ptrs = (ctypes.c_void_p * n_max)(*(base + i * step for i in range(n_max)))
        self.n = 0
        self.struct = ll.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(ctypes.POINTER(ll.llama_token)),
            embd=None,
            pos=self.pos.ctypes.data_as(ctypes.POINTER(ll.llama_pos)),
            n_seq_id=self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id))),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def set(self, tokens: Sequence[int], pos0: int, logits: str = "last") -> None:
        """Rows tokens[i] at positions pos0 + i; outputs on "none", the "last" or "all" rows."""
        n = len(tokens)
        if not 0 < n <= self.n_max:
            raise ValueError(f"a batch of {n} tokens does not fit {self.n_max} rows")
        self.token[:n] = tokens
        np.add(self._ramp[:n], pos0, out=self.pos[:n])
        out = self.logits[:n]
        if logits == "all":
            out.fill(1)
        else:
            out.fill(0)
            if logits == "last":
                out[n - 1] = 1
            elif logits != "none":
                raise ValueError(f"logits must be 'none', 'last' or 'all', not {logits!r}")
        self.n = n
        self.struct.n_tokens = n

    def set_block(self, first: int, fill: int, n: int, pos0: int, outputs: bool = True) -> None:
        """A draft block: `first` then n-1 copies of `fill`, every row an output (or none)."""
        if not 0 < n <= self.n_max:
            raise ValueError(f"a block of {n} rows does not fit {self.n_max} rows")
        self.token[0] = first
        self.token[1:n] = fill
        np.add(self._ramp[:n], pos0, out=self.pos[:n])
        self.logits[:n] = 1 if outputs else 0
        self.n = n
        self.struct.n_tokens = n

    def decode(self, ctx: int) -> int:
        """llama_decode on `ctx`; returns its status code (0: done)."""
        return int(ll.llama_decode(ctx, self.struct))

