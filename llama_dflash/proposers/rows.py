"""What the heads fed by the target's rows share (the MTP head, an EAGLE-3 head): the window of
per-position rows they draft from, the queue of target rows not yet written into their cache,
and the draft itself -- a chain of one-token decodes, each fed the hidden state the last left.

The heads differ in what a row is (the target's hidden state; an EAGLE-3 encoder's g) and in
which rows their cache holds; this module holds none of that."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional

import numpy as np
from llama_cpp import llama_cpp as ll

from .. import _bindings as ext
from ..errors import LlamaCallError
from ..target import float_view
from .topk import row_logits, top_candidate

__all__ = ["RowWindow", "RowQueue", "EmbdInput", "draft_chain"]

#: rows kept behind the newest: a rewind goes back at most one verification batch
KEEP_ROWS = 512


class RowWindow:
    """Rows of positions `start`..`start + len - 1`: the latest `keep` the target has given."""

    def __init__(self, width: int, what: str, keep: int = KEEP_ROWS):
        self.width, self.what, self.keep = width, what, keep
        self.clear()

    def clear(self) -> None:
        self.rows = np.zeros((0, self.width), dtype=np.float32)
        self.start = 0

    @property
    def end(self) -> int:
        return self.start + len(self.rows)

    def knows(self, pos: int) -> bool:
        return self.start <= pos < self.end

    def at(self, pos: int) -> np.ndarray:
        if not self.knows(pos):
            raise LlamaCallError(f"{self.what} at position {pos} is no longer kept (kept: {self.start}.."
                                 f"{self.end - 1})")
        return self.rows[pos - self.start]

    def addr(self, pos: int) -> int:
        """The address of row `pos` (valid until the next `put` or `cut`)."""
        self.at(pos)
        return self.rows.ctypes.data + (pos - self.start) * self.rows.strides[0]

    def put(self, rows: np.ndarray, pos0: int) -> None:
        """Rows of pos0.. replace those kept from pos0 on (or all of them, if pos0 is not adjacent)."""
        if self.start <= pos0 <= self.end and len(self.rows):
            rows, start = np.concatenate([self.rows[: pos0 - self.start], rows]), self.start
        else:
            start = pos0
        if len(rows) > self.keep:
            start += len(rows) - self.keep
            rows = rows[-self.keep:]
        self.rows, self.start = np.ascontiguousarray(rows, dtype=np.float32), start

    def cut(self, n_past: int) -> None:
        """Forget the rows of positions >= n_past."""
        if self.end > n_past:
            self.rows = self.rows[: max(0, n_past - self.start)]

    def state(self) -> tuple[np.ndarray, int]:
        return self.rows.copy(), self.start

    def set_state(self, state: tuple[np.ndarray, int]) -> None:
        self.rows, self.start = np.ascontiguousarray(state[0], dtype=np.float32), int(state[1])


class RowQueue:
    """The target rows that stay in its cache and are not written into the head's yet:
    (tokens, rows, pos0), copied out of buffers the next target decode overwrites."""

    def __init__(self) -> None:
        self.items: list[tuple[np.ndarray, np.ndarray, int]] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def put(self, tokens: np.ndarray, rows: np.ndarray, pos0: int) -> None:
        self.items.append((tokens, rows, pos0))

    def take(self) -> list[tuple[np.ndarray, np.ndarray, int]]:
        items, self.items = self.items, []
        return items

    def cut(self, n_past: int) -> None:
        """Forget the queued rows of positions >= n_past."""
        self.items = [(t[: n_past - p], r[: n_past - p], p) for t, r, p in self.items if p < n_past]

    def clear(self) -> None:
        self.items = []


class EmbdInput:
    """One `llama_embd` pointing into numpy rows: the input row a token of a batch is fed with."""

    def __init__(self, n_embd: int):
        self.embd = ll.llama_embd(None, 1, n_embd)
        self._data = ctypes.c_void_p.from_buffer(self.embd, ll.llama_embd.data.offset)

    def point(self, addr: int, n_embd: Optional[int] = None) -> Any:
        """The embd, pointing at `addr` (and `n_embd` wide, if given)."""
        if n_embd is not None:
            self.embd.n_embd = n_embd
        self._data.value = addr
        return self.embd

    def set_token_row(self, batch: Any, idx: int, addr: int, pos: int) -> None:
        """Feed token `idx` of `batch` the row at `addr`."""
        if not ll.llama_batch_ext_set_embd_token(batch.ptr, idx, self.point(addr)):
            raise LlamaCallError(f"llama_batch_ext_set_embd_token failed at position {pos}")


def draft_chain(ctx: Any, batch: Any, embd: EmbdInput, row: np.ndarray, token: int, pos: int, n: int,
                n_vocab: int, p_min: float, what: str,
                after_first: Optional[Callable[[], None]] = None) -> list[int]:
    """Up to n tokens, one decode each: `token` at `pos` fed `row`, then each drafted token fed the
    hidden state its predecessor's decode left (read through the nextn buffer).  Stops early where
    the top candidate's probability falls below p_min.  `after_first`: called once the first decode
    wrote its cell (the cells are the caller's to cut)."""
    tokens: list[int] = []
    with_prob = p_min > 0.0
    n_embd = row.shape[1]
    embd.point(row.ctypes.data, n_embd)
    for i in range(n):
        batch.clear()
        idx = batch.add_token(token, pos + i, True)
        embd.set_token_row(batch, idx, row.ctypes.data, pos + i)
        rc = batch.process()
        if rc != 0:
            raise LlamaCallError(f"{what}: draft decode at position {pos + i} failed (rc {rc})")
        if i == 0 and after_first is not None:
            after_first()
        token, prob = top_candidate(row_logits(ctx.ptr, 0, n_vocab, what), with_prob)
        if prob < p_min:
            break
        tokens.append(token)
        if i + 1 < n:
            h = ext.llama_get_embeddings_nextn_ith(ctx.ptr, 0)
            if not h:
                raise LlamaCallError(f"{what} produced no hidden state (llama_get_embeddings_nextn_ith)")
            row[0] = float_view(h, (n_embd,))
    return tokens
