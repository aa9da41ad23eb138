"""The n-gram speculators in pure Python: each against a brute-force statement of its rule.

The references below rescan the whole history at every call, the way llama.cpp's C++ does; the
drafters keep incremental indexes, so a disagreement means the index lost or misplaced an
occurrence.  Parity with the C++ binary itself is in test_cpp_parity.py (slow, needs the build).
"""

from __future__ import annotations

import random

import pytest

from llama_dflash.proposers.ngram import (
    NGRAM_TYPES, NgramCache, NgramMap, NgramMod, NgramSimple, cpp_ngram_args, make_ngram_drafter)


def simple_reference(toks: list[int], id_last: int, n: int, m: int) -> list[int]:
    """ngram-simple as llama.cpp states it: latest start j in [1, size-n-1] of the last n tokens."""
    size = len(toks)
    if size <= n + m + 1:
        return []
    pattern = toks[size - n + 1:] + [id_last]
    for j in range(size - n - 1, 0, -1):
        if toks[j:j + n] == pattern:
            n_copy = min(m, size - (j + n))
            return toks[j + n:j + n + n_copy] if n_copy >= n else []
    return []


def cache_reference(chunks: list[list[int]], seq: list[int]) -> list[int]:
    """ngram-cache: successor counts of the 1..4-grams lying inside each chunk it was updated
    with (the C++ updates with the tokens new since its last call), then up to 8 drafts, each the
    most frequent successor of the longest of the last 4..1 tokens that passes the thresholds.
    A tie at the top passes them only between exactly two successors; llama.cpp's unordered_map
    then lists the later-inserted one first and its strict '>' scan keeps it."""
    counts: dict[tuple[int, ...], dict[int, int]] = {}  # (dicts keep insertion order)
    for chunk in chunks:
        for k in range(1, 5):
            for i in range(k, len(chunk)):
                gram, tok = tuple(chunk[i - k:i]), chunk[i]
                c = counts.setdefault(gram, {})
                c[tok] = c.get(tok, 0) + 1
    best = {g: max(((n, i), t) for i, (t, n) in enumerate(c.items())) for g, c in counts.items()}
    best = {g: (t, n) for g, ((n, _), t) in best.items()}
    min_samples, min_percent = (2, 2, 1, 1), (66, 50, 50, 50)
    cur, out = list(seq[-4:]), []
    while len(out) < 8:
        nxt = None
        for k in range(4, 0, -1):
            gram = tuple(cur[-k:])
            if len(cur) < k or gram not in counts:
                continue
            total = sum(counts[gram].values())
            tok, count = best[gram]
            if total >= min_samples[k - 1] and 100 * count >= min_percent[k - 1] * total:
                nxt = tok
                break
        if nxt is None:
            break
        out.append(nxt)
        cur.append(nxt)
    return out


def _walk(drafter, seq: list[int], start: int):
    """Drive a drafter as the loop does (one committed token per step); yield (history, id_last, draft)."""
    drafter.begin(seq[:start])
    for t in range(start, len(seq)):
        history, id_last = seq[:t], seq[t]
        draft = drafter.draft(history, id_last)
        yield history, id_last, draft
        # the next committed token is seq[t+1]: accept the matching prefix of the draft
        acc = 0
        for a, b in zip(draft, seq[t + 1:]):
            if a != b:
                break
            acc += 1
        drafter.accept(acc, False)


@pytest.mark.parametrize("seed,vocab", [(0, 3), (1, 5), (2, 12)])
@pytest.mark.parametrize("n,m", [(1, 2), (2, 4), (3, 5)])
def test_ngram_simple_matches_a_full_rescan(seed, vocab, n, m):
    rng = random.Random(seed)
    seq = [rng.randrange(vocab) for _ in range(300)]
    seq += seq[40:120]  # a long repeat, so long copies happen too
    drafted = 0
    for history, id_last, draft in _walk(NgramSimple(n, m), seq, 20):
        assert draft == simple_reference(list(history), id_last, n, m)
        drafted += bool(draft)
    assert drafted > 20  # the test exercised drafting, not only refusals


def test_ngram_simple_copies_a_repeated_block_and_refuses_short_histories():
    block = list(range(100, 140))
    d = NgramSimple(size_n=3, size_m=8)
    d.begin([])
    assert d.draft(block[:5], block[5]) == []  # history not longer than n+m+1
    seq = [1] + block + [7, 8, 9] + block[:3]  # (a match at position 0 is never used)
    d.begin(seq[:-1])
    assert d.draft(seq[:-1], seq[-1]) == block[3:11]


def test_ngram_map_k_drafts_the_continuation_and_caps_it_by_the_last_acceptance():
    block = list(range(200, 260))
    n, m = 3, 6
    d = NgramMap(n, m, key_only=True)
    prompt = [0] + block + [1, 2, 3, 4] + block[:2]  # (position 0 means "no match" there)
    d.begin(prompt)
    first = d.draft(prompt, block[2])
    assert first == block[3:3 + m]
    d.accept(2, False)  # two of six accepted: that value's next draft is capped at two
    # a later generation whose prompt ends in the same key: the key's value is capped at two now
    prompt2 = prompt + [block[2], 77, 78, 79] + block[:2]
    d.begin(prompt2)
    assert d.draft(prompt2, block[2]) == block[3:5]
    fresh = NgramMap(n, m, key_only=True)
    fresh.begin(prompt2)
    assert fresh.draft(prompt2, block[2]) == block[3:3 + m]


def test_ngram_map_k4v_needs_min_hits_and_a_dominant_value():
    n, m = 2, 3
    key = [50, 51]
    # the key is followed by two different continuations equally often: no dominant value
    mixed = key + [1, 2, 3] + [9] + key + [4, 5, 6] + [9] + key + [1, 2, 3] + [9] + key + [4, 5, 6] + [9]
    d = NgramMap(n, m, min_hits=1, key_only=False)
    d.begin(mixed)
    assert d.draft(mixed + [key[0]], key[1]) == []
    # always the same continuation: drafts once the key was hit min_hits times
    same = (key + [1, 2, 3] + [9]) * 4
    for min_hits, expect_draft in ((1, True), (50, False)):
        d = NgramMap(n, m, min_hits=min_hits, key_only=False)
        d.begin(same)
        got = d.draft(same + [key[0]], key[1])
        assert (got == [1, 2, 3]) is expect_draft, (min_hits, got)


def test_ngram_mod_chains_its_table_and_refuses_drafts_shorter_than_n_min():
    rng = random.Random(3)
    text = [rng.randrange(1000) for _ in range(80)]
    prompt = text + [5000] + text[60:63]
    d = NgramMod(n_match=4, n_min=2, n_max=10)
    d.begin(prompt)
    assert d.used > 0
    assert d.draft(prompt, text[63]) == text[64:74]
    # the chain runs to the text's end, through the separator, and stops where the prompt ends
    chain = text[64:80] + [5000] + text[60:63]
    full = NgramMod(n_match=4, n_min=len(chain), n_max=100)
    full.begin(prompt)
    assert full.draft(prompt, text[63]) == chain
    strict = NgramMod(n_match=4, n_min=len(chain) + 1, n_max=100)
    strict.begin(prompt)
    assert strict.draft(prompt, text[63]) == []


def test_ngram_mod_clears_its_table_after_five_poor_rounds():
    rng = random.Random(4)
    text = [rng.randrange(1000) for _ in range(80)]
    prompt = text + [5000] + text[:4]
    d = NgramMod(n_match=4, n_min=2, n_max=10)
    d.begin(prompt)
    for _ in range(5):
        assert d.draft(prompt[:-1], prompt[-1])
        d.accept(0, False)
    assert d.used == 0


@pytest.mark.parametrize("seed,vocab", [(5, 3), (6, 6), (7, 20)])
def test_ngram_cache_counts_the_tokens_new_at_each_call(seed, vocab):
    rng = random.Random(seed)
    seq = [rng.randrange(vocab) for _ in range(400)]
    d = NgramCache()
    d.begin(seq[:100])
    chunks: list[list[int]] = []
    t, drafted = 100, 0
    while t < len(seq) - 1:
        # steps commit 1..6 tokens, as verification steps do
        history, id_last = seq[:t], seq[t]
        chunks.append(seq[sum(len(c) for c in chunks):t + 1])  # what is new since the last call
        draft = d.draft(history, id_last)
        assert draft == cache_reference(chunks, seq[:t + 1])
        drafted += bool(draft)
        step = rng.randint(1, 6)
        d.accept(step - 1, False)
        t += step
    assert drafted > 5


def test_factory_builds_every_type_and_refuses_what_llama_cpp_refuses():
    for name in NGRAM_TYPES:
        assert make_ngram_drafter(name).name == name
    d = make_ngram_drafter("ngram-map-k", size_n=3, size_m=5)
    assert (d.size_n, d.size_m) == (3, 5)
    bad = [("ngram-simple", dict(size_n=0)), ("ngram-map-k", dict(size_m=1025)),
           ("ngram-map-k4v", dict(min_hits=70000)), ("ngram-map-k", dict(size_n=True)),
           ("ngram-simple", dict(mod_n_match=4)), ("ngram-mod", dict(size_n=3)),
           ("ngram-mod", dict(mod_n_min=10, mod_n_max=5)), ("ngram-cache", dict(size_n=3)),
           ("ngram-nope", {})]
    for name, kw in bad:
        with pytest.raises(ValueError):
            make_ngram_drafter(name, **kw)
    with pytest.raises(ValueError):
        NgramSimple().accept(-1, False)


def test_cpp_flags_name_only_the_values_given():
    assert cpp_ngram_args("ngram-map-k") == []
    assert cpp_ngram_args("ngram-map-k4v", size_n=3, min_hits=2) == [
        "--spec-ngram-map-k4v-size-n", "3", "--spec-ngram-map-k4v-min-hits", "2"]
    assert cpp_ngram_args("ngram-mod", mod_n_match=8) == ["--spec-ngram-mod-n-match", "8"]
