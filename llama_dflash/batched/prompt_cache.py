"""A host-memory cache of slot states, so that a prompt seen before is not prefilled again.

A slot keeps its last request's cells (`BatchedEngine(prefix_reuse=True)`), but with more distinct
prompts than slots those cells are overwritten.  Before a slot's cells are dropped, its state
(the target's sequence state and the draft's, `llama_state_seq_get_data_ext`) is copied here,
keyed by the tokens it holds; a new request whose prompt shares a longer prefix with an entry
than with its slot gets that state restored into the slot and prefills only the rest.  This is
llama-server's `--cache-ram` (its prompt cache), sized in MiB, least recently used first out.
"""

from __future__ import annotations

import collections
import ctypes
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

__all__ = ["PromptCache", "Saved", "save_seq_state", "load_seq_state"]

_FLAGS = 0  # LLAMA_STATE_SEQ_FLAGS_NONE: the whole sequence state, copied to host memory


@dataclass
class Saved:
    tokens: np.ndarray  # the tokens whose cells the state holds (positions 0..)
    target: "ctypes.Array[ctypes.c_ubyte]"
    draft: "Optional[ctypes.Array[ctypes.c_ubyte]]"

    @property
    def nbytes(self) -> int:
        return len(self.target) + (len(self.draft) if self.draft is not None else 0) + self.tokens.nbytes


def save_seq_state(ctx: int, seq_id: int) -> "Optional[ctypes.Array[ctypes.c_ubyte]]":
    """A copy of one sequence's state; None where llama.cpp gives none."""
    size = int(ll.llama_state_seq_get_size_ext(ctx, seq_id, _FLAGS))
    if size <= 0:
        return None
    buf = (ctypes.c_ubyte * size)()
    if int(ll.llama_state_seq_get_data_ext(ctx, buf, size, seq_id, _FLAGS)) != size:
        return None
    return buf


def load_seq_state(ctx: int, seq_id: int, buf: "ctypes.Array[ctypes.c_ubyte]") -> bool:
    """Restore a saved state into `seq_id` (its cells are replaced); False where llama.cpp refuses."""
    return int(ll.llama_state_seq_set_data_ext(ctx, buf, len(buf), seq_id, _FLAGS)) > 0


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PromptCache:
    """Saved slot states, at most `limit_bytes` in all, the least recently used evicted first."""

    def __init__(self, limit_bytes: int):
        if limit_bytes < 0:
            raise ValueError("the prompt cache size must be >= 0")
        self.limit_bytes = int(limit_bytes)
        self._entries: "collections.OrderedDict[bytes, Saved]" = collections.OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.saves = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: Sequence[int], target, draft=None) -> None:
        arr = np.asarray(tokens, dtype=np.int32)
        entry = Saved(arr, target, draft)
        if entry.nbytes > self.limit_bytes:
            return
        key = arr.tobytes()
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        # an entry whose tokens are a prefix of the new one's is worth nothing more
        for k in [k for k, e in self._entries.items() if len(e.tokens) <= len(arr)
                  and common_prefix(e.tokens, arr) == len(e.tokens)]:
            self.nbytes -= self._entries.pop(k).nbytes
        self._entries[key] = entry
        self.nbytes += entry.nbytes
        self.saves += 1
        while self.nbytes > self.limit_bytes and self._entries:
            _, gone = self._entries.popitem(last=False)
            self.nbytes -= gone.nbytes

    def best(self, prompt: Sequence[int]) -> tuple[Optional[Saved], int]:
        """The entry sharing the longest prefix with `prompt`, and that length (0: none)."""
        p = np.asarray(prompt, dtype=np.int32)
        best, best_n = None, 0
        for key, entry in self._entries.items():
            n = common_prefix(entry.tokens, p)
            if n > best_n:
                best, best_n = key, n
        if best is None:
            return None, 0
        self._entries.move_to_end(best)
        return self._entries[best], best_n
