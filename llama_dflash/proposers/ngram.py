"""llama.cpp's n-gram speculators, re-implemented in Python with the same results.

Each class here proposes, step for step, the draft that llama.cpp's `--spec-type` of the same name
proposes in `llama-speculative-simple` (llama.cpp as vendored by llama-cpp-python 0.3.36: the
`common/ngram-map`, `common/ngram-mod` and `common/ngram-cache` sources and the
`common_speculative_impl_*` wrappers in `common/speculative.cpp`).  The point is a fair comparison:
our own drafters and llama.cpp's run in the same Python generation loop, and a benchmark can also
run the C++ driver with identical settings (`cpp_ngram_args`).

The C++ code rescans the history at every call; done the same way in Python that would cost
milliseconds per step.  Here every drafter keeps a private copy of the history plus an index from
each n-gram to its start positions, extended only by the tokens added since the last call, and
answers "the most recent occurrence inside the C++ loop's bounds" with a bisection.  Quirks of the
C++ code that change which tokens are proposed are kept on purpose (each class says which).

Measured on this machine's CPU (Python 3.11, 4,000-token history, a random 64-token vocabulary
with a repeated block so that matches occur, one token appended per call, defaults):
ngram-simple ~5 us, ngram-map-k ~8 us, ngram-map-k4v ~10 us, ngram-mod ~11 us (amortised; the
call that adds a 32-token chunk to the table costs ~40 us), ngram-cache ~12 us per call.  A
`begin` with a 4,000-token prompt costs 2-10 ms once per generation (indexing the prompt).

The drafters assume non-negative token ids and, within one generation, a history that only
grows (the `TokenDrafter` contract); `begin` starts a new generation.
"""

from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .base import TokenDrafter

__all__ = [
    "NGRAM_TYPES",
    "NgramSimple",
    "NgramMap",
    "NgramMod",
    "NgramCache",
    "make_ngram_drafter",
    "cpp_ngram_args",
]

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")

# llama.cpp's defaults (common/common.h) and the bounds its argument parser enforces (common/arg.cpp).
MAP_DEFAULTS = {"size_n": 12, "size_m": 48, "min_hits": 1}
MOD_DEFAULTS = {"n_match": 24, "n_min": 48, "n_max": 64}
_SIZE_MAX = 1024          # --spec-ngram-*-size-n/-size-m and the mod lengths: at most 1024
_UINT16_MAX = 0xFFFF      # min_hits lands in a uint16_t field

# ngram-map: hash table of n-gram start positions, LCG hash truncated to 32 bits.
_MAP_HASH_FACTOR = 2654435761
_MAP_HASH_SLOTS = 262144  # 2**18
_MAP_MAX_VALUES = 4       # value m-grams remembered per key n-gram
_MAP_MAX_COUNT = 16380    # saturation of the hit counters

# ngram-mod: one table shared by all generations, 64-bit multiplicative hash.
_MOD_HASH_FACTOR = 6364136223846793005
_MOD_TABLE_SLOTS = 4 * 1024 * 1024
_MOD_RESET_OCCUPANCY = 0.25
_MOD_CHUNK = 32           # new n-grams are added once more than this many tokens are pending
_MOD_LOW_ACCEPT = 0.25    # an acceptance fraction below this is a "low" round...
_MOD_LOW_STREAK = 5       # ...and this many in a row clear the table

# ngram-cache: context cache of 1..4-grams, fixed draft length (speculative.cpp's create_state).
_CACHE_NGRAM_MIN = 1
_CACHE_NGRAM_MAX = 4
_CACHE_N_DRAFT = 8
_CACHE_MIN_SAMPLES = (2, 2, 1, 1)     # per n-gram size 1..4 ("lax" thresholds of the context cache)
_CACHE_MIN_PERCENT = (66, 50, 50, 50)

_BULK = 128  # windows above which hashing goes through numpy


# --------------------------------------------------------------------------------------------
# shared helpers


def _to_ints(seq) -> list[int]:
    """A fresh list of Python ints (never an alias of the caller's list).

    A list whose ends are Python ints is taken to hold only Python ints (converting element by
    element would cost more than the whole lookup)."""
    if isinstance(seq, np.ndarray):
        return seq.tolist()
    out = list(seq)
    if out and (type(out[0]) is not int or type(out[-1]) is not int):
        out = [int(t) for t in out]
    return out


def _window_hashes(seg: list[int], n: int, factor: int, mask: int) -> list[int]:
    """Polynomial hash (h = h*factor + t, modulo mask+1) of every n-window of seg, in order.

    The C++ hashes wrap at 32 or 64 bits and are then reduced modulo a power of two, so only the
    low bits matter and the hash can be rolled."""
    count = len(seg) - n + 1
    if count <= 0:
        return []
    factor &= mask
    if count >= _BULK:
        return _window_hashes_bulk(seg, n, factor, mask)
    lead = pow(factor, n - 1, mask + 1)
    h = 0
    for t in seg[:n]:
        h = (h * factor + t) & mask
    out = [h]
    for k in range(1, count):
        h = ((h - seg[k - 1] * lead) * factor + seg[k + n - 1]) & mask
        out.append(h)
    return out


def _window_hashes_bulk(seg: list[int], n: int, factor: int, mask: int) -> list[int]:
    """`_window_hashes` in a fixed number of numpy passes, independent of n.

    With the factor odd (both C++ factors are) it is invertible modulo a power of two:
    hash(j) = factor**(j+n-1) * (Q[j+n] - Q[j]) with Q the prefix sums of t[i] * factor**-i.
    uint64 arithmetic wraps modulo 2**64, which keeps every value right modulo mask+1."""
    modulus = mask + 1
    count = len(seg) - n + 1
    toks = np.asarray(seg, dtype=np.int64).astype(np.uint64)
    inv = np.full(len(seg), pow(factor, -1, modulus), dtype=np.uint64)
    inv[0] = 1
    prefix = np.zeros(len(seg) + 1, dtype=np.uint64)
    np.cumsum(toks * np.cumprod(inv), out=prefix[1:])
    scale = np.full(count, factor, dtype=np.uint64)
    scale[0] = pow(factor, n - 1, modulus)
    return (((prefix[n:] - prefix[:count]) * np.cumprod(scale)) & np.uint64(mask)).tolist()


def _hash(tokens: Sequence[int], factor: int, mask: int) -> int:
    h = 0
    for t in tokens:
        h = (h * factor + t) & mask
    return h


class _NgramIndex:
    """A private copy of the history and, for one n, the ascending start positions of each n-gram.

    `sync` extends both by the tokens added since the last call, so a lookup never scans."""

    __slots__ = ("n", "tokens", "starts")

    def __init__(self, n: int):
        self.n = n
        self.tokens: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}

    def reset(self, seq: Sequence[int] = ()) -> None:
        self.tokens = []
        self.starts = {}
        self._append(_to_ints(seq))

    def sync(self, history: Sequence[int]) -> bool:
        """Catch up with `history`; True when it was not an extension and everything was rebuilt."""
        have = len(self.tokens)
        size = len(history)
        if size < have or (have and int(history[have - 1]) != self.tokens[-1]):
            self.reset(history)
            return True
        if size > have:
            self._append(_to_ints(history[have:]))
        return False

    def _append(self, new: list[int]) -> None:
        toks, n, starts = self.tokens, self.n, self.starts
        first = max(0, len(toks) - n + 1)
        toks.extend(new)
        for j in range(first, len(toks) - n + 1):
            gram = tuple(toks[j:j + n])
            where = starts.get(gram)
            if where is None:
                starts[gram] = [j]
            else:
                where.append(j)

    def latest(self, gram: tuple[int, ...], lo: int, hi: int) -> int:
        """Largest start j with lo <= j <= hi, or -1."""
        where = self.starts.get(gram)
        if not where:
            return -1
        k = bisect_right(where, hi) - 1
        return where[k] if k >= 0 and where[k] >= lo else -1

    def between(self, gram: tuple[int, ...], lo: int, hi: int) -> list[int]:
        """All starts j with lo <= j <= hi, ascending."""
        where = self.starts.get(gram)
        if not where:
            return []
        return where[bisect_left(where, lo):bisect_right(where, hi)]


def _check_int(value, label: str, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{label} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{label} must be an integer, got {value!r}") from None
    if not lo <= value <= hi:
        raise ValueError(f"{label} must be between {lo} and {hi}, got {value}")
    return value


def _check_map_params(size_n, size_m, min_hits) -> tuple[int, int, int]:
    return (_check_int(size_n, "size_n", 1, _SIZE_MAX),
            _check_int(size_m, "size_m", 1, _SIZE_MAX),
            _check_int(min_hits, "min_hits", 1, _UINT16_MAX))


def _check_accepted(n_accepted) -> int:
    return _check_int(n_accepted, "n_accepted", 0, _UINT16_MAX)


# --------------------------------------------------------------------------------------------
# ngram-simple


class NgramSimple:
    """`ngram-simple`: copy what followed the latest earlier occurrence of the last n tokens.

    The pattern is the last size_n-1 history tokens plus id_last.  llama.cpp searches start
    positions j from len-size_n-1 down to 1 (an occurrence at position 0 is never used), needs a
    history longer than size_n+size_m+1, and drops the draft when fewer than size_n tokens (not
    size_m) follow the match.  min_hits is accepted, as llama.cpp accepts it, and unused."""

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1):
        self.size_n, self.size_m, self.min_hits = _check_map_params(size_n, size_m, min_hits)
        self.n_max = self.size_m
        self._index = _NgramIndex(self.size_n)

    def begin(self, prompt: Sequence[int]) -> None:
        # llama.cpp keeps no state; we only re-seed the index with the new generation's tokens.
        self._index.reset(prompt)

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        n, m, index = self.size_n, self.size_m, self._index
        index.sync(history)
        toks = index.tokens
        size = len(toks)
        if size <= n + m + 1:
            return []
        pattern = tuple(toks[size - n + 1:]) + (int(id_last),)
        pos = index.latest(pattern, 1, size - n - 1)
        if pos < 1:
            return []
        n_copy = min(m, size - (pos + n))
        if n_copy < n:
            return []
        return toks[pos + n:pos + n + n_copy]

    def accept(self, n_accepted: int, is_other: bool) -> None:
        _check_accepted(n_accepted)


# --------------------------------------------------------------------------------------------
# ngram-map-k / ngram-map-k4v


@dataclass(slots=True)
class _MapValue:
    """One m-gram seen after a key: where (0 = free slot), how often, and the last acceptance."""

    idx: int = 0
    num: int = 0
    n_accepted: int = -1


@dataclass(slots=True)
class _MapKey:
    """A key n-gram that produced a match: first match position, statistics scanned up to stat_idx."""

    idx: int
    stat_idx: int = 0
    num: int = 0
    values: list[_MapValue] = field(default_factory=list)


class NgramMap:
    """`ngram-map-k` (key_only) and `ngram-map-k4v`: n-gram lookup through llama.cpp's map.

    Which earlier occurrence is used is decided like llama.cpp does, and that is not simply "the
    latest": a 2**18-slot hash table remembers, per slot, the first position inserted (collisions
    included, so a colliding n-gram can hide an older occurrence); positions enter it in descending
    order, the prompt part at the first call of a generation, new positions at each call; only the
    positions not yet in the table are scanned, newest first; and the n+m+1 positions just before
    the end of the `begin` prompt are never searched.  The draft is always the m tokens after the
    matched position, capped by the last acceptance of the chosen value (map-k: of value slot 0).
    map-k ignores min_hits.  map-k4v counts, per key, up to four distinct m-grams after its
    occurrences (rescanning from the last statistics position, which counts that occurrence again),
    drafts only if the key was hit min_hits times and the most frequent value has at least twice
    the count of all the others together; it then still drafts the tokens after the match, not the
    most frequent value's tokens -- as llama.cpp does.  `accept` stores the accepted length as the
    chosen value's new cap."""

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, *, key_only: bool):
        self.size_n, self.size_m, self.min_hits = _check_map_params(size_n, size_m, min_hits)
        self.key_only = bool(key_only)
        self.name = "ngram-map-k" if self.key_only else "ngram-map-k4v"
        self.n_max = self.size_m
        self._index = _NgramIndex(self.size_n)
        self.keys: list[_MapKey] = []
        self._key_offsets: dict[tuple[int, ...], int] | None = {}
        self._size_last_begin = 0
        self._idx_last_check = 0
        self._last_draft: tuple[int, int] | None = None  # (key offset, value slot) of the last draft
        self._slots: dict[int, int] = {}  # hash slot -> start position (absent = llama.cpp's 0)
        self._slots_last_idx = 0

    # -- life cycle ---------------------------------------------------------------------------

    def begin(self, prompt: Sequence[int]) -> None:
        n, m = self.size_n, self.size_m
        size = len(prompt)
        cleanup = self._size_last_begin
        if cleanup > size:
            cleanup = size - n - m if size > n + m else 0
        if size < self._idx_last_check:
            # the history shrank: forget positions at or after `cleanup`
            self._slots = {s: j for s, j in self._slots.items() if j < cleanup}
            self._slots_last_idx = cleanup - 1 if cleanup > 0 else 0
            if self.keys:
                self._prune_keys(cleanup)
        self._idx_last_check = size
        self._size_last_begin = size
        self._index.reset(prompt)
        self._key_offsets = None

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        self._last_draft = None
        n, m, index = self.size_n, self.size_m, self._index
        if index.sync(history):
            self._key_offsets = None
        toks = index.tokens
        size = len(toks)
        if size < 2 * n + m:
            return []
        if self._idx_last_check > size or self._size_last_begin > size:
            raise RuntimeError(f"{self.name}: history shorter than at the last call or begin(); "
                               "call begin() for a new generation")
        self._idx_last_check = size
        key = tuple(toks[size - n + 1:]) + (int(id_last),)
        pos = self._find(key, size)
        if pos == 0:
            return []
        return self._draft_for(key, pos)

    def accept(self, n_accepted: int, is_other: bool) -> None:
        n_accepted = _check_accepted(n_accepted)
        if is_other or self._last_draft is None:
            return
        k, v = self._last_draft
        if k < len(self.keys):
            # the C++ field is an int16_t
            self.keys[k].values[v].n_accepted = n_accepted - 0x10000 if n_accepted >= 0x8000 else n_accepted

    # -- lookup --------------------------------------------------------------------------------

    def _find(self, key: tuple[int, ...], size: int) -> int:
        """The match position llama.cpp picks (0 = none), then the hash table's insertions."""
        n, m, index, toks = self.size_n, self.size_m, self._index, self._index.tokens
        limit = size - n - m - 1
        begin = self._size_last_begin
        done = self._slots_last_idx
        pos = self._slots.get(_hash(key, _MAP_HASH_FACTOR, _MAP_HASH_SLOTS - 1), 0)
        if not (pos and pos < limit and tuple(toks[pos:pos + n]) == key):
            pos = 0
        if pos == 0 and begin > n + m + 1:
            pos = max(index.latest(key, done + 1, begin - n - m - 1), 0)
        first_new = max(begin, done) + 1
        if pos == 0:
            pos = max(index.latest(key, first_new, limit), 0)
        if begin > n + m + 1:
            self._insert_slots(done + 1, begin - n - m - 1)
        self._insert_slots(first_new, limit)
        self._slots_last_idx = max(limit, done)
        return pos

    def _insert_slots(self, lo: int, hi: int) -> None:
        """Insert start positions hi, hi-1, ..., lo where their slot is still free."""
        if hi < lo:
            return
        n, slots = self.size_n, self._slots
        hashes = _window_hashes(self._index.tokens[lo:hi + n], n, _MAP_HASH_FACTOR, _MAP_HASH_SLOTS - 1)
        if len(hashes) >= _BULK:
            # ascending insertion keeps the largest position per slot; entries already there win
            fresh = dict(zip(hashes, range(lo, hi + 1)))
            fresh.update(slots)
            self._slots = fresh
            return
        for j in range(hi, lo - 1, -1):
            s = hashes[j - lo]
            if s not in slots:
                slots[s] = j

    # -- statistics and draft --------------------------------------------------------------------

    def _key_offset(self, key: tuple[int, ...], pos: int) -> int:
        """Offset of the first stored key with these tokens; appends a new key if none."""
        if self._key_offsets is None:
            n, toks, offsets = self.size_n, self._index.tokens, {}
            for i, k in enumerate(self.keys):
                offsets.setdefault(tuple(toks[k.idx:k.idx + n]), i)
            self._key_offsets = offsets
        off = self._key_offsets.get(key)
        if off is None:
            off = len(self.keys)
            self.keys.append(_MapKey(idx=pos, values=[_MapValue(0, 0, self.size_m)
                                                      for _ in range(_MAP_MAX_VALUES)]))
            self._key_offsets[key] = off
        return off

    def _draft_for(self, key: tuple[int, ...], pos: int) -> list[int]:
        n, m, toks = self.size_n, self.size_m, self._index.tokens
        off = self._key_offset(key, pos)
        cur = self.keys[off]
        cur.num = min(cur.num + 1, _MAP_MAX_COUNT)
        if self.key_only:
            slot = 0
        else:
            if cur.num < self.min_hits:
                return []
            self._count_values(cur, key, pos)
            slot = self._pick_value(cur)
            if slot < 0:
                return []
        self._last_draft = (off, slot)
        n_draft = min(m, cur.values[slot].n_accepted)
        return toks[pos + n:pos + n + max(n_draft, 0)]

    def _count_values(self, cur: _MapKey, key: tuple[int, ...], pos: int) -> None:
        n, m, toks = self.size_n, self.size_m, self._index.tokens
        for i in self._index.between(key, cur.stat_idx, pos):
            start = i + n
            gram = toks[start:start + m]
            for val in cur.values:
                if val.idx == 0:
                    val.idx, val.num, val.n_accepted = start, 0, m
                elif toks[val.idx:val.idx + m] != gram:
                    continue
                val.num = min(val.num + 1, _MAP_MAX_COUNT)
                break
        cur.stat_idx = pos

    @staticmethod
    def _pick_value(cur: _MapKey) -> int:
        """Slot of the most frequent value, or -1 when it is not twice as frequent as the rest."""
        best, slot = 0, 0
        for v, val in enumerate(cur.values):
            if val.num > best:
                best, slot = val.num, v
        others = sum(val.num for val in cur.values) - cur.values[slot].num
        if others > 0 and best < 2 * others:
            return -1
        return slot

    def _prune_keys(self, cleanup: int) -> None:
        """Drop keys (and, for k4v, values) that start at or after `cleanup`, as llama.cpp does."""
        for i in range(len(self.keys) - 1, -1, -1):
            cur = self.keys[i]
            if cur.idx >= cleanup:
                del self.keys[i]
                continue
            if self.key_only:
                continue
            vals = cur.values
            for j in range(_MAP_MAX_VALUES - 1, -1, -1):
                if vals[j].idx != 0 and vals[j].idx >= cleanup:
                    tail = vals[-1]
                    del vals[j]
                    vals.append(_MapValue(0, 0, tail.n_accepted))
            if vals[0].idx == 0:
                del self.keys[i]


# --------------------------------------------------------------------------------------------
# ngram-mod


class NgramMod:
    """`ngram-mod`: a hash table from n_match-gram to the next token, chained to draft up to n_max.

    The table has 4*1024*1024 slots (a later n-gram overwrites its slot, collisions included) and
    persists across generations: `begin` adds the prompt's n-grams, then clears the table if more
    than a quarter of the slots are used.  During generation new n-grams are added only once more
    than 32 tokens are pending.  A draft shorter than n_min is refused; five accepted rounds in a
    row with less than a quarter of the (untruncated) draft accepted clear the table and re-add
    the history at the next call."""

    name = "ngram-mod"

    def __init__(self, n_match: int = 24, n_min: int = 48, n_max: int = 64):
        self.n_match = _check_int(n_match, "mod_n_match", 1, _SIZE_MAX)
        self.n_min = _check_int(n_min, "mod_n_min", 0, _SIZE_MAX)
        self.n_max = _check_int(n_max, "mod_n_max", 0, _SIZE_MAX)
        if self.n_min > self.n_max:
            raise ValueError(f"mod_n_min ({self.n_min}) must not exceed mod_n_max ({self.n_max})")
        self._table: dict[int, int] = {}  # slot -> next token; an absent slot is llama.cpp's -1
        self._i_last = 0
        self._n_draft_last = 0
        self._n_low = 0

    @property
    def used(self) -> int:
        """Occupied table slots."""
        return len(self._table)

    def begin(self, prompt: Sequence[int]) -> None:
        self._i_last = 0
        self._n_draft_last = 0
        n = self.n_match
        if len(prompt) < n:
            return
        self._add(prompt, 0, len(prompt) - n)
        self._i_last = len(prompt) - n
        if len(self._table) / _MOD_TABLE_SLOTS > _MOD_RESET_OCCUPANCY:
            self._table.clear()

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        self._n_draft_last = 0
        n, size = self.n_match, len(history)
        if size < n:
            return []
        if self._i_last + _MOD_CHUNK < size:
            self._add(history, self._i_last, size - n)
            self._i_last = size - n
        window = _to_ints(history[size - n + 1:size]) + [int(id_last)]
        mask = _MOD_TABLE_SLOTS - 1
        factor = _MOD_HASH_FACTOR & mask
        lead = pow(factor, n - 1, _MOD_TABLE_SLOTS)
        h = _hash(window, factor, mask)
        table, out = self._table, []
        for i in range(self.n_max):
            tok = table.get(h)
            if tok is None:
                if i < self.n_min:
                    return []
                break
            out.append(tok)
            window.append(tok)
            h = ((h - window[i] * lead) * factor + tok) & mask
        self._n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int, is_other: bool) -> None:
        n_accepted = _check_accepted(n_accepted)
        if is_other or self._n_draft_last == 0:
            return
        if n_accepted / self._n_draft_last < _MOD_LOW_ACCEPT:
            self._n_low += 1
            if self._n_low >= _MOD_LOW_STREAK:
                self._table.clear()
                self._n_low = 0
                self._i_last = 0
        else:
            self._n_low = 0

    def _add(self, tokens: Sequence[int], lo: int, hi: int) -> None:
        """Map the n-gram starting at each i in [lo, hi) to the token after it (later ones win)."""
        if hi <= lo:
            return
        n = self.n_match
        seg = _to_ints(tokens[lo:hi + n])
        hashes = _window_hashes(seg, n, _MOD_HASH_FACTOR, _MOD_TABLE_SLOTS - 1)
        self._table.update(zip(hashes, seg[n:]))


# --------------------------------------------------------------------------------------------
# ngram-cache


class _CachePart:
    """Counts of the tokens seen after one n-gram, in first-seen order, with the running maximum."""

    __slots__ = ("counts", "total", "best", "best_count")

    def __init__(self, token: int):
        self.counts: dict[int, int] = {token: 1}
        self.total = 1
        self.best = token
        self.best_count = 1

    def choice(self) -> tuple[int, int]:
        """(token, count) llama.cpp's scan of its std::unordered_map settles on.

        A tie at the top only survives the thresholds with exactly two tokens of equal count; in
        libstdc++'s node order a two-element map lists the later-inserted token first, so that one
        wins the strict '>' scan.  Otherwise the maximum is unique or the result is rejected."""
        if len(self.counts) == 2:
            (a, ca), (b, cb) = self.counts.items()
            return (a, ca) if ca > cb else (b, cb)
        return self.best, self.best_count


class NgramCache:
    """`ngram-cache`: llama.cpp's lookup decoding with the context cache only.

    The static and dynamic cache files (`--lookup-cache-static/-dynamic`) are not supported: this
    is the configuration `llama-speculative-simple --spec-type ngram-cache` runs without them.
    Drafts up to 8 tokens, each the most frequent successor of the longest of the last 4..1 tokens
    whose counts pass llama.cpp's thresholds (at least 2/2/1/1 samples and 66/50/50/50 % for
    sizes 1/2/3/4).  Like llama.cpp, the cache is updated only with n-grams lying entirely inside
    the tokens added since the previous call (plus id_last), and `begin` does nothing: the cache
    and its high-water mark persist across generations.  n-grams reaching before the start of a
    very short history (undefined in the C++ code) count as absent."""

    name = "ngram-cache"
    n_max = _CACHE_N_DRAFT

    def __init__(self):
        self._parts: dict[tuple[int, ...], _CachePart] = {}
        self._cache_size = 0

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        size = len(history)
        if self._cache_size < size + 1:
            self._update(_to_ints(history[self._cache_size:size]) + [int(id_last)])
            self._cache_size = size + 1
        if size + 1 < 2:
            return []
        seq = _to_ints(history[max(0, size - (_CACHE_NGRAM_MAX - 1)):size]) + [int(id_last)]
        out: list[int] = []
        while len(out) < _CACHE_N_DRAFT:
            tok = self._next(seq)
            if tok is None:
                break
            out.append(tok)
            seq.append(tok)
        return out

    def accept(self, n_accepted: int, is_other: bool) -> None:
        _check_accepted(n_accepted)

    def _update(self, chunk: list[int]) -> None:
        parts = self._parts
        size = len(chunk)
        for k in range(_CACHE_NGRAM_MIN, min(_CACHE_NGRAM_MAX, size - 1) + 1):
            grams = zip(*[chunk[i:size - k + i] for i in range(k)])  # chunk[i-k:i] for i >= k
            for gram, token in zip(grams, chunk[k:]):
                part = parts.get(gram)
                if part is None:
                    parts[gram] = _CachePart(token)
                    continue
                count = part.counts.get(token, 0) + 1
                part.counts[token] = count
                part.total += 1
                if count > part.best_count:
                    part.best, part.best_count = token, count

    def _next(self, seq: list[int]) -> int | None:
        for k in range(_CACHE_NGRAM_MAX, _CACHE_NGRAM_MIN - 1, -1):
            if len(seq) < k:
                continue
            part = self._parts.get(tuple(seq[-k:]))
            if part is None:
                continue
            token, count = part.choice()
            if part.total < _CACHE_MIN_SAMPLES[k - 1]:
                continue
            if 100 * count < _CACHE_MIN_PERCENT[k - 1] * part.total:
                continue
            return token
        return None


# --------------------------------------------------------------------------------------------
# factory and the matching C++ flags


_MAP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v")


def _resolve(name: str, size_n, size_m, min_hits, mod_n_match, mod_n_min, mod_n_max) -> dict[str, int]:
    """Validate the settings for `name` and return the ones given (None dropped)."""
    if name not in NGRAM_TYPES:
        raise ValueError(f"unknown n-gram speculator {name!r}; expected one of {', '.join(NGRAM_TYPES)}")
    map_kw = {"size_n": size_n, "size_m": size_m, "min_hits": min_hits}
    mod_kw = {"n_match": mod_n_match, "n_min": mod_n_min, "n_max": mod_n_max}
    given_map = {k: v for k, v in map_kw.items() if v is not None}
    given_mod = {k: v for k, v in mod_kw.items() if v is not None}
    if name in _MAP_TYPES:
        if given_mod:
            raise ValueError(f"{name} takes size_n/size_m/min_hits, not mod_{next(iter(given_mod))}")
        full = {**MAP_DEFAULTS, **given_map}
        _check_map_params(full["size_n"], full["size_m"], full["min_hits"])
        return {k: operator.index(v) for k, v in given_map.items()}
    if given_map:
        raise ValueError(f"{name} does not take {next(iter(given_map))} "
                         f"({'use mod_n_match/mod_n_min/mod_n_max' if name == 'ngram-mod' else 'it has no settings'})")
    if name == "ngram-mod":
        full = {**MOD_DEFAULTS, **given_mod}
        NgramMod(full["n_match"], full["n_min"], full["n_max"])  # validates
        return {k: operator.index(v) for k, v in given_mod.items()}
    if given_mod:
        raise ValueError(f"{name} does not take mod_{next(iter(given_mod))} (it has no settings)")
    return {}


def make_ngram_drafter(name: str, *, size_n: int | None = None, size_m: int | None = None,
                       min_hits: int | None = None, mod_n_match: int | None = None,
                       mod_n_min: int | None = None, mod_n_max: int | None = None) -> TokenDrafter:
    """The drafter llama.cpp's `--spec-type name` builds; None keeps llama.cpp's default.

    size_n/size_m/min_hits apply to ngram-simple/-map-k/-map-k4v, mod_* to ngram-mod; a setting
    given to a type that does not take it is an error, as is any value llama.cpp would reject."""
    given = _resolve(name, size_n, size_m, min_hits, mod_n_match, mod_n_min, mod_n_max)
    if name == "ngram-simple":
        return NgramSimple(**{**MAP_DEFAULTS, **given})
    if name in ("ngram-map-k", "ngram-map-k4v"):
        return NgramMap(**{**MAP_DEFAULTS, **given}, key_only=name == "ngram-map-k")
    if name == "ngram-mod":
        return NgramMod(**{**MOD_DEFAULTS, **given})
    return NgramCache()


def cpp_ngram_args(name: str, *, size_n: int | None = None, size_m: int | None = None,
                   min_hits: int | None = None, mod_n_match: int | None = None,
                   mod_n_min: int | None = None, mod_n_max: int | None = None) -> list[str]:
    """The `llama-speculative-simple` flags that set the same values as `make_ngram_drafter`.

    Only the values given (not None) become flags; `--spec-type` itself is not included (repeating
    it would add the speculator twice, since llama.cpp appends to the type list)."""
    given = _resolve(name, size_n, size_m, min_hits, mod_n_match, mod_n_min, mod_n_max)
    if name == "ngram-mod":
        flags = (("n_match", "--spec-ngram-mod-n-match"), ("n_min", "--spec-ngram-mod-n-min"),
                 ("n_max", "--spec-ngram-mod-n-max"))
    else:
        prefix = "--spec-" + name
        flags = (("size_n", prefix + "-size-n"), ("size_m", prefix + "-size-m"),
                 ("min_hits", prefix + "-min-hits"))
    args: list[str] = []
    for key, flag in flags:
        if key in given:
            args += [flag, str(given[key])]
    return args
