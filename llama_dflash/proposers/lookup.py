"""Suffix lookup: draft the continuation of the longest earlier match of the current suffix.

A drafter that needs no model.  At every step it looks for the longest suffix of
history + [id_last] that occurred earlier -- in the prompt, in the output so far, or (with
`session=True`) in the previous generations of this drafter -- and proposes the tokens that
followed the most recent such occurrence.  A continuation that runs into the current suffix
keeps copying what it has just proposed, so a repeating pattern continues.  It is what wins on
answers that copy (editing a given function, JSON -> YAML, repeating a paragraph, quoting a
document, repeating an earlier list); llama.cpp's n-gram speculators need a 12-token match by
default and so rarely draft at all there.

Index.  A suffix automaton over the token sequence, extended only by the new tokens of each
call (amortised O(1) per token), plus a window cursor on the state of the last `max_match`
tokens.  Each state keeps `recent`, the end of its most recent occurrence; only states of
strings no longer than `max_match` are kept up to date (the walk from the window state to the
root), which is all a query reads: the match length is capped at `max_match`, and among the
occurrences of the capped match the most recent wins.  A query walks suffix links from the
window until the next token has a transition, O(max_match) at worst and amortised O(1) when
id_last is committed next.  Per-call cost (draft + accept), measured by
`python -m llama_dflash.proposers.lookup` on this repository's shared 2-core CPU (CPython 3.11),
history 3,500-4,000 tokens, one new token per call: 7 us on random tokens, 9-10 us in a long
copy, 8-11 us with the model stuck in a 3-token loop, 9 us with a full session archive (8
sequences, 31k tokens) searched as well -- against ~1 ms for a GPU step.  Indexing costs about
1 us per token (begin() on a 3,500-token prompt: 3-4 ms); a session archive that must drop its
oldest sequence is rebuilt at begin() (31k tokens: about 33 ms).

Session.  With `session=True`, begin() archives the finished sequence (the tokens indexed so far
plus the last id_last) into one more suffix automaton over the retained sequences, each followed
by a separator of its own, so no match crosses a sequence boundary and a continuation stops at
its sequence's end.  An archive match is used only when it is strictly longer than the best
match in the current history and has a continuation.

Confidence.  The probability that draft slot i is accepted given slots < i were is modelled
by the match length the slot sees: after i accepted tokens the match is L + i long, so slot i
reads the acceptance rate of bucket(L + i) (buckets 1, 2, 3, 4-5, 6-8, 9-16, 17+).  Each
bucket has a Beta prior whose mean rises with the length (fitted on SmolLM2's greedy answers,
see bench/lookup_sim.py), updated online with successes/trials, the total weight capped so that
the estimate follows a change of workload.

Learning.  From the drafter's own verified drafts (`accept(n, is_other=False)`), and by shadow
scoring: when the last prediction was not verified (another drafter's draft, or none, or a
draft shorter than min_match), it is scored at the next call against the tokens that were
actually committed after id_last (the tokens the new history reveals, plus the new id_last);
a prediction that agrees with all revealed tokens is censored there, not counted as a failure.
No extra call is needed: the caller only keeps calling `predict`/`draft` every step.

Defaults, from bench/lookup_sim.py's tuning set (SmolLM2-135M greedy answers, 6 copy-heavy
workloads x 3 prompts + 6 open-chat prompts; held-out prompts only for the final check).
min_match=2: a 1-token match is accepted 12% of the time on open chat (41% on copy-heavy), a
2-token one 49% (63%); min_match 2 has the best or near-best tau / (1 + beta * drafted tokens per
step) for every beta in 0.02-0.25, while 1 loses 10-30% on open chat once verifying costs
something.  prior = the pooled per-bucket rates; prior_strength=4 (1 calibrates about as well,
5.1% vs 5.5% mean error of the predicted tokens per step, but is noisier at the start; 16+ is
worse).  p_min=0.0 (no truncation) as the plain-TokenDrafter default; where a verified token
costs ~10% of a step, p_min 0.1-0.3 buys 7-13% (the simulation's speedup proxy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

__all__ = ["LookupDraft", "SuffixLookup", "BUCKETS", "DEFAULT_PRIOR", "bucket_of"]

#: Match-length buckets of the acceptance statistics: (lowest, highest) length, inclusive.
BUCKETS: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (3, 3), (4, 5), (6, 8), (9, 16), (17, 1 << 30))

#: Prior mean acceptance per bucket: the conditional acceptance per bucket of (L + slot) measured
#: on the tuning set of bench/lookup_sim.py (SmolLM2-135M greedy, k=8, copy-heavy and open chat
#: pooled: 0.22 0.57 0.74 0.80 0.88 0.90 0.98), rounded.  On open chat alone a 1-token match is
#: right 12% of the time and a 2-3 token one about half the time; 17+ is right 98% everywhere.
DEFAULT_PRIOR: tuple[float, ...] = (0.2, 0.55, 0.7, 0.8, 0.85, 0.9, 0.97)

_BUCKET_OF_LEN = [0] + [next(b for b, (lo, hi) in enumerate(BUCKETS) if lo <= n <= hi) for n in range(1, 18)]


def bucket_of(length: int) -> int:
    """Index in BUCKETS of a match length >= 1."""
    return _BUCKET_OF_LEN[length] if length < 18 else len(BUCKETS) - 1


@dataclass(frozen=True)
class LookupDraft:
    """A proposed draft with its confidence.

    `p_accept[i]` is the probability that slot i is accepted given slots < i were (so the
    chance that the first i+1 tokens all survive is the product up to i).  `source` says where
    the match was found: "history" (prompt + output so far), "session" (an earlier generation)
    or "" (no match)."""

    tokens: list[int]
    match_length: int
    p_accept: list[float]
    source: str = ""

    def cumulative(self) -> list[float]:
        """P(slots 0..i all accepted), for each i."""
        out, prod = [], 1.0
        for p in self.p_accept:
            prod *= p
            out.append(prod)
        return out

    def expected_accepted(self, k: Optional[int] = None) -> float:
        """Expected number of accepted tokens when the first k are verified (all when k is None)."""
        cum = self.cumulative()
        return sum(cum if k is None else cum[:max(k, 0)])


# ----------------------------------------------------------------------------- the index

class _SuffixIndex:
    """Suffix automaton over a token sequence that only grows, with recency per short state.

    State 0 is the root.  `recent[s]` is the end position of the most recent occurrence of the
    strings of s, kept exact for states whose strings are at most `cap` long."""

    __slots__ = ("cap", "tokens", "length", "link", "trans", "recent", "last", "win", "win_len")

    def __init__(self, cap: int):
        self.cap = cap
        self.tokens: list[int] = []
        self.length = [0]
        self.link = [-1]
        self.trans: list[dict[int, int]] = [{}]
        self.recent = [-1]
        self.last = 0
        self.win = 0  # state of the last min(n, cap) tokens
        self.win_len = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self._append(t)

    def _append(self, t: int) -> None:
        length, link, trans, recent = self.length, self.link, self.trans, self.recent
        i = len(self.tokens)
        self.tokens.append(t)
        cur = len(length)
        length.append(length[self.last] + 1)
        link.append(0)
        trans.append({})
        recent.append(i)
        p = self.last
        while p != -1 and t not in trans[p]:
            trans[p][t] = cur
            p = link[p]
        if p != -1:
            q = trans[p][t]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                length.append(length[p] + 1)
                link.append(link[q])
                trans.append(dict(trans[q]))
                recent.append(recent[q])
                while p != -1 and trans[p].get(t) == q:
                    trans[p][t] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self.last = cur
        self.win, self.win_len = self.advance(self.win, self.win_len, t)
        s = self.win
        while s > 0:
            recent[s] = i
            s = link[s]

    def advance(self, st: int, ell: int, t: int) -> tuple[int, int]:
        """Matching cursor (state, length) of a text moved past token t, length capped at cap."""
        length, link, trans = self.length, self.link, self.trans
        while st > 0 and length[link[st]] >= ell:  # the state was split since the cursor was set
            st = link[st]
        while st > 0 and t not in trans[st]:
            st = link[st]
            ell = length[st]
        nxt = trans[st].get(t)
        if nxt is None:
            return 0, 0
        ell += 1
        if ell > self.cap:
            ell = self.cap
            if length[link[nxt]] >= ell:
                nxt = link[nxt]
        return nxt, ell

    def match(self, st: int, ell: int, c: int) -> tuple[int, int]:
        """(L, end): the longest x.c with x a suffix of the cursor's text, |x.c| <= cap, that occurs
        in this index, and the end position of its most recent occurrence; (0, -1) if none."""
        length, link, trans = self.length, self.link, self.trans
        if ell >= self.cap:
            ell = self.cap - 1
        while st > 0 and length[link[st]] >= ell:
            st = link[st]
        while st > 0 and c not in trans[st]:
            st = link[st]
            ell = length[st]
        nxt = trans[st].get(c)
        if nxt is None:
            return 0, -1
        return ell + 1, self.recent[nxt]


@dataclass
class _Archive:
    """Earlier generations' sequences, indexed together (each followed by its own separator)."""

    cap: int
    max_sequences: int
    max_tokens: int
    sequences: list[list[int]] = field(default_factory=list)
    index: Optional[_SuffixIndex] = None
    n_added: int = 0  # separators are -1, -2, ...: unique, never equal to a token

    def add(self, seq: list[int]) -> None:
        if not seq:
            return
        seq = seq[-self.max_tokens:]
        self.sequences.append(seq)
        evicted = False
        while len(self.sequences) > self.max_sequences or sum(map(len, self.sequences)) > self.max_tokens:
            self.sequences.pop(0)
            evicted = True
        if evicted or self.index is None:
            self.index = _SuffixIndex(self.cap)
            self.n_added = 0
            for s in self.sequences:
                self._index(s)
        else:
            self._index(seq)

    def _index(self, seq: list[int]) -> None:
        self.n_added += 1
        self.index.extend(seq)
        self.index.extend((-self.n_added,))

    def continuation(self, end: int, n: int) -> list[int]:
        out = self.index.tokens[end + 1:end + 1 + n]
        for i, t in enumerate(out):
            if t < 0:
                return out[:i]
        return out

    @property
    def n_tokens(self) -> int:
        return sum(map(len, self.sequences))


# ----------------------------------------------------------------------------- the drafter

@dataclass
class _Candidate:
    """A prediction as made, untruncated by min_match/p_min, kept for scoring."""

    n: int
    id_last: int
    tokens: list[int]
    match_length: int
    resolved: bool = False


@dataclass
class _Bucket:
    trials: float = 0.0
    accepted: float = 0.0
    verified: int = 0  # raw counts, for stats()
    shadow: int = 0


class SuffixLookup:
    """Longest-suffix-match drafter with per-slot confidence (see the module docstring).

    n_max: longest draft.  min_match: shortest match worth drafting from (shorter: empty
    draft).  p_min: `draft()` stops where P(all tokens so far accepted) drops below it.
    max_match: cap on the match length (longer matches tie; the most recent wins).
    session: also search the previous generations (bounded by session_max_sequences /
    session_max_tokens), after the current history.  prior / prior_strength: Beta prior mean
    per bucket and its weight in pseudo-trials.  max_weight: cap on a bucket's trial weight."""

    name = "lookup"

    def __init__(self, n_max: int = 16, *, min_match: int = 2, p_min: float = 0.0, max_match: int = 64,
                 session: bool = False, session_max_sequences: int = 8, session_max_tokens: int = 32768,
                 prior: Sequence[float] = DEFAULT_PRIOR, prior_strength: float = 4.0,
                 max_weight: float = 256.0):
        if n_max < 0 or min_match < 1 or max_match < 2:
            raise ValueError("need n_max >= 0, min_match >= 1, max_match >= 2")
        if len(prior) != len(BUCKETS):
            raise ValueError(f"prior needs {len(BUCKETS)} values, one per bucket")
        self.n_max = n_max
        self.min_match = min_match
        self.p_min = p_min
        self.max_match = max_match
        self.prior = tuple(float(p) for p in prior)
        self.prior_strength = prior_strength
        self.max_weight = max_weight
        self._buckets = [_Bucket() for _ in BUCKETS]
        self._archive = _Archive(max_match, session_max_sequences, session_max_tokens) if session else None
        self._cur = _SuffixIndex(max_match)
        self._arc_cursor = (0, 0)
        self._last_id: Optional[int] = None
        self._cached: Optional[tuple[tuple[int, int, int], LookupDraft]] = None
        self._pending: Optional[_Candidate] = None
        self._drafted: Optional[tuple[int, int]] = None  # (match_length, len(draft)) awaiting accept
        self._counts = {"predictions": 0, "drafts": 0, "drafted_tokens": 0, "accepted_tokens": 0,
                        "session_matches": 0, "rebuilds": 0}

    # -- life cycle

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts: archive the finished one (session), index the prompt."""
        if self._archive is not None and len(self._cur):
            seq = list(self._cur.tokens)
            if self._last_id is not None:
                seq.append(self._last_id)
            self._archive.add(seq)
        self._reset_current(_ints(prompt))
        self._pending = None
        self._drafted = None

    def draft(self, history: Sequence[int], id_last: int) -> list[int]:
        """predict(...).tokens, cut where the chance that all of them survive drops below p_min."""
        pred = self.predict(history, id_last)
        tokens = pred.tokens
        if self.p_min > 0.0:
            keep = 0
            for c in pred.cumulative():
                if c < self.p_min:
                    break
                keep += 1
            tokens = tokens[:keep]
        self._drafted = (pred.match_length, len(tokens)) if tokens else None
        if tokens:
            self._counts["drafts"] += 1
            self._counts["drafted_tokens"] += len(tokens)
        return list(tokens)

    def take(self, pred: LookupDraft, k: int) -> list[int]:
        """Draft the first k tokens of `pred` (the last `predict`): what `draft` does when a caller
        chose the length itself (the `auto` proposer); `accept` then scores them."""
        tokens = list(pred.tokens[:max(k, 0)])
        self._drafted = (pred.match_length, len(tokens)) if tokens else None
        if tokens:
            self._counts["drafts"] += 1
            self._counts["drafted_tokens"] += len(tokens)
        return tokens

    def accept(self, n_accepted: int, is_other: bool) -> None:
        """Learn from the verification of this drafter's own draft; other steps are shadow-scored
        at the next call (see the module docstring)."""
        drafted, self._drafted = self._drafted, None
        if is_other or drafted is None:
            return
        match_length, k = drafted
        a = max(0, min(n_accepted, k))
        self._counts["accepted_tokens"] += a
        self._score(match_length, a, failed=a < k, shadow=False)
        if self._pending is not None:
            self._pending.resolved = True

    def predict(self, history: Sequence[int], id_last: int) -> LookupDraft:
        """The draft after history + [id_last] with its per-slot conditional acceptance."""
        n = len(history)
        id_last = int(id_last)
        key = (n, id_last, self.n_max)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        self._shadow_score(history, id_last)
        self._catch_up(history)
        cand, source = self._find(id_last)
        self._pending = cand
        self._last_id = id_last
        self._counts["predictions"] += 1
        if cand.match_length < self.min_match or not cand.tokens:
            pred = LookupDraft([], cand.match_length, [], "")
        else:
            pred = LookupDraft(list(cand.tokens), cand.match_length, self._p_slots(cand.match_length, len(cand.tokens)),
                               source)
            self._counts["session_matches"] += source == "session"
        self._cached = (key, pred)
        return pred

    # -- confidence

    def p_bucket(self, b: int) -> float:
        """Posterior mean acceptance of bucket b."""
        bk = self._buckets[b]
        return (bk.accepted + self.prior_strength * self.prior[b]) / (bk.trials + self.prior_strength)

    def _p_slots(self, match_length: int, k: int) -> list[float]:
        per_bucket = [self.p_bucket(b) for b in range(len(BUCKETS))]
        return [per_bucket[bucket_of(match_length + i)] for i in range(k)]

    def _score(self, match_length: int, n_ok: int, failed: bool, shadow: bool) -> None:
        """Slots 0..n_ok-1 accepted; slot n_ok rejected when `failed`."""
        for i in range(n_ok + (1 if failed else 0)):
            bk = self._buckets[bucket_of(match_length + i)]
            if bk.trials >= self.max_weight:
                scale = (self.max_weight - 1.0) / bk.trials
                bk.trials *= scale
                bk.accepted *= scale
            bk.trials += 1.0
            bk.accepted += 1.0 if i < n_ok else 0.0
            if shadow:
                bk.shadow += 1
            else:
                bk.verified += 1

    def _shadow_score(self, history: Sequence[int], id_last: int) -> None:
        """Score the previous, unverified prediction against what was committed after it."""
        cand, self._pending = self._pending, None
        if cand is None or cand.resolved or not cand.tokens or cand.match_length == 0:
            return
        n = len(history)
        if n <= cand.n or int(history[cand.n]) != cand.id_last:
            return
        revealed = _ints(history[cand.n + 1:n]) + [id_last]
        a = 0
        for want, got in zip(cand.tokens, revealed):
            if want != got:
                break
            a += 1
        failed = a < min(len(cand.tokens), len(revealed))
        self._score(cand.match_length, a, failed, shadow=True)

    # -- index upkeep and lookup

    def _reset_current(self, tokens: list[int]) -> None:
        self._cur = _SuffixIndex(self.max_match)
        self._cur.extend(tokens)
        self._arc_cursor = (0, 0)
        if self._archive is not None and self._archive.index is not None:
            self._advance_archive(tokens)
        self._cached = None

    def _catch_up(self, history: Sequence[int]) -> None:
        """Index the tokens committed since the last call (rebuild if the history is not an extension)."""
        cur, n = self._cur, len(history)
        m = len(cur)
        if n < m or (m and int(history[m - 1]) != cur.tokens[m - 1]):
            self._counts["rebuilds"] += 1
            self._reset_current(_ints(history))
            return
        if n > m:
            new = _ints(history[m:n])
            cur.extend(new)
            if self._archive is not None and self._archive.index is not None:
                self._advance_archive(new)

    def _advance_archive(self, tokens: list[int]) -> None:
        st, ell = self._arc_cursor
        advance = self._archive.index.advance
        for t in tokens:
            st, ell = advance(st, ell, t)
        self._arc_cursor = (st, ell)

    def _find(self, id_last: int) -> tuple[_Candidate, str]:
        cur, k = self._cur, self.n_max
        n = len(cur)
        L, end = cur.match(cur.win, cur.win_len, id_last)
        source = "history" if L else ""
        if self._archive is not None and self._archive.index is not None:
            La, end_a = self._archive.index.match(*self._arc_cursor, id_last)
            if La > L:
                cont = self._archive.continuation(end_a, k)
                if cont:  # (a match at the very end of an archived sequence has nothing to offer)
                    return _Candidate(n, id_last, cont, La), "session"
        if L == 0:
            return _Candidate(n, id_last, [], 0), ""
        return _Candidate(n, id_last, _continue(cur.tokens, end, id_last, k), L), source

    # -- reporting

    def stats(self) -> dict:
        """Acceptance per match-length bucket and drafting counters (JSON-friendly)."""
        buckets = []
        for b, (lo, hi) in enumerate(BUCKETS):
            bk = self._buckets[b]
            buckets.append({"lengths": f"{lo}" if lo == hi else (f"{lo}+" if hi >= 1 << 29 else f"{lo}-{hi}"),
                            "prior": self.prior[b], "p": round(self.p_bucket(b), 4),
                            "trials": round(bk.trials, 2), "accepted": round(bk.accepted, 2),
                            "verified_slots": bk.verified, "shadow_slots": bk.shadow})
        out = dict(self._counts)
        out.update(buckets=buckets, history_tokens=len(self._cur), min_match=self.min_match,
                   session_sequences=len(self._archive.sequences) if self._archive else 0,
                   session_tokens=self._archive.n_tokens if self._archive else 0)
        return out


def _continue(tokens: list[int], end: int, id_last: int, k: int) -> list[int]:
    """Tokens after position `end` of tokens + [id_last], continuing periodically past the end
    (the copy reads what it has just written: a repeating pattern keeps repeating)."""
    base = tokens[end + 1:]
    base.append(id_last)
    if k <= len(base):
        return base[:k]
    reps = -(-k // len(base))
    return (base * reps)[:k]


def _ints(seq: Sequence[int]) -> list[int]:
    if hasattr(seq, "tolist"):
        return [int(t) for t in seq.tolist()]
    return [int(t) for t in seq]


def _bench() -> None:
    """Per-call cost at a 4,000-token history (module docstring numbers)."""
    import random
    import time

    rng = random.Random(0)

    def run(label: str, seq: list[int], session: bool = False) -> None:
        lk = SuffixLookup(16, session=session)
        if session:
            for _ in range(8):
                lk.begin([rng.randrange(3000) for _ in range(3900)])
                lk.draft([rng.randrange(3000) for _ in range(3900)], 1)
        t0 = time.perf_counter()
        lk.begin(seq[:3500])
        t_begin = time.perf_counter() - t0
        hist, n_calls = seq[:3500], 0
        t0 = time.perf_counter()
        for n in range(3500, 4000):
            lk.draft(hist, seq[n])
            lk.accept(0, False)
            hist.append(seq[n])
            n_calls += 1
        dt = (time.perf_counter() - t0) / n_calls
        print(f"{label:34s} {dt * 1e6:6.1f} us/call   begin(3500): {t_begin * 1e3:6.1f} ms")

    text = [rng.randrange(3000) for _ in range(2000)]
    run("random tokens", [rng.randrange(3000) for _ in range(4001)])
    run("copy (1000 new + 3 copies)", (text[:1000] * 4 + [1])[:4001])
    run("3-token loop after 1000", (text[:1000] + [7, 8, 9] * 1001)[:4001])
    run("random + 8-sequence session", [rng.randrange(3000) for _ in range(4001)], session=True)
    arc = _Archive(64, 8, 32768)
    seqs = [[rng.randrange(3000) for _ in range(3900)] for _ in range(9)]
    for s in seqs[:8]:
        arc.add(s)
    t0 = time.perf_counter()
    arc.add(seqs[8])
    print(f"session rebuild on eviction ({arc.n_tokens} tokens): {(time.perf_counter() - t0) * 1e3:.0f} ms")


if __name__ == "__main__":
    _bench()
