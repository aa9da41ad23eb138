"""The suffix-lookup drafter: match choice, continuation, session cache, confidence (pure Python)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from llama_dflash.proposers.lookup import BUCKETS, DEFAULT_PRIOR, LookupDraft, SuffixLookup, bucket_of


def _fresh(history, **kw) -> SuffixLookup:
    lk = SuffixLookup(**kw)
    lk.begin(history)
    return lk


def _brute(history: list[int], id_last: int, cap: int) -> tuple[int, int]:
    """Longest L <= cap with history+[id_last]'s last L tokens ending earlier; the latest end."""
    s = list(history) + [id_last]
    n = len(history)
    for length in range(min(cap, n), 0, -1):
        suffix = s[-length:]
        for end in range(n - 1, length - 2, -1):
            if s[end - length + 1:end + 1] == suffix:
                return length, end
    return 0, -1


def _brute_draft(history: list[int], id_last: int, end: int, k: int) -> list[int]:
    seq = list(history) + [id_last]
    while len(seq) < end + 1 + k:
        seq.append(seq[len(seq) - (len(history) - end)])  # copy at the match's distance
    return seq[end + 1:end + 1 + k]


# ----------------------------------------------------------------------------- match choice

def test_longest_match_wins_over_a_more_recent_shorter_one():
    # "1 2 3" is followed by 50 early on; "2 3" alone is followed by 60 later.
    hist = [1, 2, 3, 50, 9, 9, 8, 2, 3, 60, 7, 1, 2]
    pred = _fresh(hist, n_max=4).predict(hist, 3)
    assert pred.match_length == 3
    assert pred.tokens[0] == 50
    assert pred.source == "history"


def test_most_recent_occurrence_among_equal_lengths():
    hist = [4, 1, 2, 10, 11, 5, 1, 2, 20, 21, 6, 1]
    pred = _fresh(hist, n_max=2).predict(hist, 2)
    assert pred.match_length == 2
    assert pred.tokens == [20, 21]


def test_self_overlapping_repetition_continues():
    hist = [9, 1, 2, 3, 1, 2, 3, 1]
    pred = _fresh(hist, n_max=8).predict(hist, 2)
    assert pred.tokens == [3, 1, 2, 3, 1, 2, 3, 1]
    run = [5, 7, 7, 7]
    assert _fresh(run, n_max=6).predict(run, 7).tokens == [7] * 6


def test_match_length_is_capped_and_ties_go_to_the_latest():
    block = list(range(10, 30))
    hist = block + [1] + block + [2] + block[:-1]
    pred = _fresh(hist, n_max=3, max_match=8).predict(hist, block[-1])
    assert pred.match_length == 8
    assert pred.tokens[0] == 2  # the second copy is the most recent with an 8-token match


def test_min_match_and_no_match():
    hist = [1, 5, 6, 7]
    lk = _fresh(hist, n_max=4, min_match=2)
    pred = lk.predict(hist, 1)  # only "1" matches
    assert pred.match_length == 1 and pred.tokens == [] and pred.p_accept == []
    assert lk.draft(hist, 1) == []
    assert _fresh(hist, n_max=4, min_match=1).draft(hist, 1) == [5, 6, 7, 1]
    none = _fresh(hist, n_max=4, min_match=1).predict(hist, 99)
    assert none.match_length == 0 and none.tokens == [] and none.source == ""


def test_n_max_limits_the_draft_and_can_change():
    hist = list(range(40)) + [0, 1]
    lk = _fresh(hist, n_max=5)
    assert lk.draft(hist, 2) == [3, 4, 5, 6, 7]
    lk.n_max = 2
    assert lk.draft(hist, 2) == [3, 4]
    lk.n_max = 0
    assert lk.draft(hist, 2) == []


def test_numpy_history_works_and_grows():
    hist = np.array([3, 4, 5, 6, 3, 4], dtype=np.int32)
    lk = _fresh(hist, n_max=3)
    assert lk.draft(hist, np.int64(5)) == [6, 3, 4]
    longer = np.concatenate([hist, np.array([5, 6], dtype=np.int32)])
    pred = lk.predict(longer, 3)
    assert pred.tokens == [4, 5, 6] and pred.match_length == 5
    assert all(type(t) is int for t in pred.tokens)


def test_history_that_is_not_an_extension_rebuilds_the_index():
    lk = _fresh([1, 2, 3, 1, 2], n_max=2)
    assert lk.draft([1, 2, 3, 1, 2], 3) == [1, 2]
    other = [8, 9, 8]
    assert lk.draft(other, 9) == [8, 9]
    assert lk.stats()["rebuilds"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_incremental_index_agrees_with_brute_force(seed):
    rng = random.Random(seed)
    for _ in range(40):
        vocab = rng.choice([2, 3, 5, 30])
        cap = rng.choice([2, 3, 5, 64])
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(2, 90))]
        if rng.random() < 0.4:  # copies and loops
            seq = seq + seq[:rng.randrange(1, len(seq) + 1)] * rng.randrange(1, 3)
        start = rng.randrange(len(seq) - 1)
        lk = SuffixLookup(n_max=7, min_match=1, max_match=cap)
        lk.begin(seq[:start])
        n = start
        while n < len(seq) - 1:
            length, end = _brute(seq[:n], seq[n], cap)
            pred = lk.predict(seq[:n], seq[n])
            assert pred.match_length == length, (seq, n)
            assert pred.tokens == (_brute_draft(seq[:n], seq[n], end, 7) if length else [])
            n += rng.randrange(1, 5)


# ----------------------------------------------------------------------------- session cache

def test_session_finds_earlier_generations_across_begin():
    lk = SuffixLookup(n_max=3, session=True)
    lk.begin([1, 2])
    lk.draft([1, 2, 40, 41, 42, 43], 44)  # the generation ends after this step
    lk.begin([7, 8, 40, 41])
    pred = lk.predict([7, 8, 40, 41], 42)
    assert pred.source == "session" and pred.match_length == 3
    assert pred.tokens == [43, 44]  # stops at the end of the archived sequence
    plain = SuffixLookup(n_max=3)
    plain.begin([1, 2])
    plain.draft([1, 2, 40, 41, 42, 43], 44)
    plain.begin([7, 8, 40, 41])
    assert plain.predict([7, 8, 40, 41], 42).match_length == 0


def test_session_prefers_current_history_at_equal_length():
    lk = SuffixLookup(n_max=1, session=True)
    lk.begin([3, 5, 6])
    lk.draft([3, 5, 6], 100)  # archived: 3 5 6 100
    cur = [5, 6, 200, 0, 5]
    lk.begin(cur)
    pred = lk.predict(cur, 6)  # "5 6" in both: the current history's continuation wins
    assert pred.match_length == 2 and pred.tokens == [200] and pred.source == "history"
    cur += [6, 200, 3, 5]
    longer = lk.predict(cur, 6)  # "3 5 6" only in the archive
    assert longer.match_length == 3 and longer.source == "session" and longer.tokens == [100]


def test_session_is_bounded_by_sequences_and_tokens():
    lk = SuffixLookup(n_max=2, session=True, session_max_sequences=2)
    for g in range(4):
        lk.begin([1000 + g, 1500 + g, 2000 + g])
    lk.begin([1000])  # archives generation 3: the archive keeps generations 2 and 3
    assert lk.stats()["session_sequences"] == 2
    assert lk.predict([1000], 1500).match_length == 0  # generation 0 was dropped
    newest = lk.predict([1003], 1503)  # (a new history: the current index is rebuilt)
    assert newest.source == "session" and newest.tokens == [2003]
    small = SuffixLookup(n_max=2, session=True, session_max_tokens=10)
    for g in range(5):
        small.begin([g * 10 + i for i in range(4)])
    small.begin([99])
    assert small.stats()["session_tokens"] <= 10


def _brute_archive(archive: list[list[int]], history: list[int], id_last: int, cap: int, k: int):
    """Longest match of history+[id_last]'s suffix inside one archived sequence (latest wins)."""
    s = list(history) + [id_last]
    for length in range(min(cap, len(s)), 0, -1):
        suffix = s[-length:]
        for seq in reversed(archive):
            for end in range(len(seq) - 1, length - 2, -1):
                if seq[end - length + 1:end + 1] == suffix:
                    return length, seq[end + 1:end + 1 + k]
    return 0, []


@pytest.mark.parametrize("seed", range(4))
def test_session_lookup_agrees_with_brute_force(seed):
    rng = random.Random(100 + seed)
    lk = SuffixLookup(n_max=5, min_match=1, max_match=6, session=True, session_max_sequences=3)
    archive: list[list[int]] = []
    for _ in range(8):
        gen = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        lk.begin(gen[:1])
        n = last = 1
        while n < len(gen):
            length, end = _brute(gen[:n], gen[n], 6)
            la, cont = _brute_archive(archive, gen[:n], gen[n], 6, 5)
            pred = lk.predict(gen[:n], gen[n])
            last = n
            if la > length and cont:
                assert (pred.match_length, pred.tokens, pred.source) == (la, cont, "session")
            else:
                assert pred.match_length == length
                assert pred.tokens == (_brute_draft(gen[:n], gen[n], end, 5) if length else [])
            n += rng.randrange(1, 3)
        archive = (archive + [gen[:last + 1]])[-3:]  # what the next begin() archives


# ----------------------------------------------------------------------------- confidence

def test_expected_accepted_arithmetic():
    d = LookupDraft([1, 2, 3], 3, [0.5, 0.5, 1.0])
    assert d.cumulative() == [0.5, 0.25, 0.25]
    assert d.expected_accepted() == pytest.approx(1.0)
    assert d.expected_accepted(2) == pytest.approx(0.75)
    assert d.expected_accepted(0) == 0.0
    assert d.expected_accepted(10) == pytest.approx(1.0)


def test_prior_rises_with_match_length_and_slots_read_bucket_of_L_plus_i():
    assert list(DEFAULT_PRIOR) == sorted(DEFAULT_PRIOR)
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 6, 8, 9, 16, 17, 500)] == [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    hist = [9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1]
    pred = _fresh(hist, n_max=6).predict(hist, 2)  # L = 2
    assert pred.match_length == 2
    assert pred.p_accept == [pytest.approx(DEFAULT_PRIOR[bucket_of(2 + i)]) for i in range(6)]


def _feed(lk: SuffixLookup, hist: list[int], id_last: int, n_accepted: int, rounds: int) -> None:
    for _ in range(rounds):
        lk._cached = None  # a fresh step at the same place
        lk.draft(hist, id_last)
        lk.accept(n_accepted, False)


def test_confidence_rises_with_acceptance_and_falls_with_rejection():
    hist = [9, 1, 2, 3, 4, 5, 6, 0, 1]
    base = _fresh(hist, n_max=4).predict(hist, 2).p_accept[0]
    up = _fresh(hist, n_max=4)
    _feed(up, hist, 2, 4, 20)
    up._cached = None
    assert up.predict(hist, 2).p_accept[0] > base
    down = _fresh(hist, n_max=4)
    _feed(down, hist, 2, 0, 20)
    down._cached = None
    assert down.predict(hist, 2).p_accept[0] < base
    st = down.stats()
    assert st["buckets"][bucket_of(2)]["verified_slots"] == 20
    assert st["buckets"][bucket_of(3)]["verified_slots"] == 0  # slot 1 was never reached


def test_unverified_predictions_are_shadow_scored_against_what_was_committed():
    hist = [9, 1, 2, 3, 4, 5, 6, 0, 1]
    lk = _fresh(hist, n_max=4)
    assert lk.draft(hist, 2) == [3, 4, 5, 6]
    lk.accept(1, True)  # another drafter's draft was verified: 2 committed, then 3, 4 accepted, 7 sampled
    lk.predict(hist + [2, 3, 4], 7)
    b = lk.stats()["buckets"]
    assert b[bucket_of(2)]["shadow_slots"] == 1 and b[bucket_of(3)]["shadow_slots"] == 1
    assert b[bucket_of(4)]["shadow_slots"] == 1  # slot 2 drafted 5, 7 came: a failure
    assert b[bucket_of(4)]["accepted"] == 0.0 and b[bucket_of(2)]["accepted"] == 1.0


def test_draft_reuses_the_prediction_of_the_same_step():
    hist = [1, 2, 3, 1, 2]
    lk = _fresh(hist, n_max=3)
    pred = lk.predict(hist, 3)
    assert lk.draft(hist, 3) == pred.tokens
    assert lk.stats()["predictions"] == 1


def test_p_min_truncates_where_the_cumulative_probability_drops():
    hist = [9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1]
    for p_min in (0.0, 0.3, 0.45, 0.9):
        lk = _fresh(hist, n_max=8, p_min=p_min)
        pred = lk.predict(hist, 2)
        keep = sum(1 for c in pred.cumulative() if c >= p_min)
        assert lk.draft(hist, 2) == pred.tokens[:keep]
    assert _fresh(hist, n_max=8).draft(hist, 2) == [3, 4, 5, 6, 7, 8, 0, 1]


def test_stats_cover_every_bucket_and_constructor_checks():
    st = SuffixLookup().stats()
    assert [b["lengths"] for b in st["buckets"]] == ["1", "2", "3", "4-5", "6-8", "9-16", "17+"]
    assert len(st["buckets"]) == len(BUCKETS) and st["min_match"] == 2
    with pytest.raises(ValueError):
        SuffixLookup(min_match=0)
    with pytest.raises(ValueError):
        SuffixLookup(prior=(0.5,))
