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
from typing import Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

__all__ = ["TokenBatch", "logits_addr", "logits_ith_addr"]

_SMALL = 32  # up to this many rows a Python loop over a memoryview beats numpy's per-call cost


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
        self._ramp = np.arange(max(n_max, 4096), dtype=np.int32)  # positions are slices of it
        self._fill: tuple = ()  # (fill token, n) rows 1..n-1 of the last block hold
        # llama_batch.seq_id is one pointer per row to that row's seq ids: here into self.seq_id
        base, step = self.seq_id.ctypes.data, self.seq_id.itemsize
        self._seq_ptrs = (ctypes.c_void_p * n_max)(*(base + i * step for i in range(n_max)))
        self.n = 0
        # small batches (a verify batch, a draft block) are written through memoryviews, which
        # cost a fraction of a numpy call per row; the positions come from a slice of a ramp
        self._tok_mv = memoryview(self.token)
        self._pos_mv = memoryview(self.pos)
        self._ramp_mv = memoryview(self._ramp)
        self._out_state: tuple = ()  # (how, n) the logits flags were last filled for
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
        if logits not in ("all", "last", "none"):
            raise ValueError(f"logits must be 'none', 'last' or 'all', not {logits!r}")
        self._fill = ()
        if n <= _SMALL:
            tok = self._tok_mv
            for i, t in enumerate(tokens):
                tok[i] = t  # an id outside int32 raises (ValueError), as with numpy
        else:
            self.token[:n] = tokens
        end = pos0 + n
        if 0 <= pos0 and end <= len(self._ramp):
            self._pos_mv[:n] = self._ramp_mv[pos0:end]
        else:
            self._positions(pos0, n)
        if self._out_state != (logits, n):
            self._outputs(logits, n)
        self.n = n
        self.struct.n_tokens = n

    def set_block(self, first: int, fill: int, n: int, pos0: int, outputs: bool = True) -> None:
        """A draft block: `first` then n-1 copies of `fill`, every row an output (or none)."""
        if not 0 < n <= self.n_max:
            raise ValueError(f"a block of {n} rows does not fit {self.n_max} rows")
        self._tok_mv[0] = first
        if self._fill != (fill, n):
            self.token[1:n] = fill
            self._fill = (fill, n)
        end = pos0 + n
        if 0 <= pos0 and end <= len(self._ramp):
            self._pos_mv[:n] = self._ramp_mv[pos0:end]
        else:
            self._positions(pos0, n)
        how = "all" if outputs else "none"
        if self._out_state != (how, n):
            self._outputs(how, n)
        self.n = n
        self.struct.n_tokens = n

    def _positions(self, pos0: int, n: int) -> None:
        end = pos0 + n
        if pos0 < 0 or end > len(self._ramp):
            if pos0 < 0:
                np.add(self._ramp[:n], pos0, out=self.pos[:n])
                return
            self._grow_ramp(end)
        self._pos_mv[:n] = self._ramp_mv[pos0:end]

    def _grow_ramp(self, end: int) -> None:
        size = max(end, 2 * len(self._ramp))
        self._ramp = np.arange(size, dtype=np.int32)
        self._ramp_mv = memoryview(self._ramp)

    def _outputs(self, how: str, n: int) -> None:
        """Output flags of rows 0..n-1: "all", "none" or only the "last" row (kept when unchanged)."""
        if self._out_state == (how, n):
            return
        out = self.logits[:n]
        out.fill(1 if how == "all" else 0)
        if how == "last":
            out[n - 1] = 1
        self._out_state = (how, n)

    def decode(self, ctx: int) -> int:
        """llama_decode on `ctx`; returns its status code (0: done)."""
        return int(ll.llama_decode(ctx, self.struct))

