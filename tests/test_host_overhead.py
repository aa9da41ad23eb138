"""The speculative step's host-side shortcuts (issue 28 item 5) do what the plain code did."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, SpecConfig
from llama_dflash._batch import TokenBatch
from llama_dflash.proposers import dflash as dflash_mod


def _reference(tokens, pos0, logits, n_max):
    """What TokenBatch.set wrote before the memoryview path: plain numpy."""
    n = len(tokens)
    out = np.zeros(n, dtype=np.int8)
    if logits == "all":
        out[:] = 1
    elif logits == "last":
        out[n - 1] = 1
    return np.asarray(tokens, dtype=np.int32), np.arange(pos0, pos0 + n, dtype=np.int32), out


def test_token_batch_rows_match_numpy_filling():
    b = TokenBatch(64)
    rng = np.random.default_rng(0)
    cases = [((5, 1, 2), 0, "all"), ((7,), 100, "last"), ((9, 9), 100, "last"), (list(range(40)), 3, "none"),
             ((1, 2, 3, 4, 5), 5000, "all"), ((3,) * 64, 9000, "last"), ((np.int64(4), 2), 17, "all")]
    cases += [(tuple(int(x) for x in rng.integers(0, 300, size=int(rng.integers(1, 20)))),
               int(rng.integers(0, 20000)), str(rng.choice(["all", "last", "none"]))) for _ in range(50)]
    for tokens, pos0, how in cases:
        b.set(tokens, pos0, how)
        tok, pos, out = _reference(tokens, pos0, how, 64)
        n = len(tokens)
        assert b.n == b.struct.n_tokens == n
        np.testing.assert_array_equal(b.token[:n], tok)
        np.testing.assert_array_equal(b.pos[:n], pos)
        np.testing.assert_array_equal(b.logits[:n], out)
    with pytest.raises(ValueError):
        b.set((2 ** 40,), 0, "all")
    with pytest.raises(ValueError):
        b.set((1,), 0, "some")


def test_token_batch_blocks_after_other_rows():
    b = TokenBatch(16)
    for first, fill, n, pos0, outputs in [(5, 3, 5, 10, True), (6, 3, 5, 11, True), (7, 3, 8, 12, False),
                                          (8, 4, 8, 13, True), (9, 4, 3, 20000, True)]:
        b.set((1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0, "last")  # rows a block must overwrite
        b.set_block(first, fill, n, pos0, outputs)
        np.testing.assert_array_equal(b.token[:n], [first] + [fill] * (n - 1))
        np.testing.assert_array_equal(b.pos[:n], np.arange(pos0, pos0 + n))
        np.testing.assert_array_equal(b.logits[:n], np.full(n, 1 if outputs else 0))
        b.set_block(first + 1, fill, n, pos0 + 1, outputs)  # the fill kept from the last block
        np.testing.assert_array_equal(b.token[:n], [first + 1] + [fill] * (n - 1))


def test_address_of_feature_rows():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert dflash_mod._address(a) == a.ctypes.data
    assert dflash_mod._address(a[1:]) == a[1:].ctypes.data
    ro = a.copy()
    ro.flags.writeable = False
    assert dflash_mod._address(ro) == ro.ctypes.data  # no ctypes view of a read-only buffer


def test_rollback_skips_only_a_cut_the_cache_never_reached(tiny_config, tiny_draft, monkeypatch):
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        p = eng._dflash
        calls = []
        real = p.ctx.seq_rm
        monkeypatch.setattr(p.ctx, "seq_rm", lambda *a: calls.append(a[1]) or real(*a))
        prompt = eng.tokenize(PROMPT_TEXT)
        eng.target.clear()
        p.clear()
        eng.target.decode(prompt, 0, logits="none")
        feats = eng.target.layer_features()
        p.inject(feats, 0)
        p.rollback(len(prompt))  # after clear() the cache is unknown: cut
        assert calls == [len(prompt)]
        p.propose(prompt[-1], len(prompt), 4)  # writes the prompt rows, then drops the block's cells
        assert p.ctx.pos_max(0) == len(prompt) - 1
        calls.clear()
        p.rollback(len(prompt) + 2)  # nothing there: no llama.cpp call
        assert calls == []
        p.rollback(len(prompt) - 3)  # rows that are there: cut
        assert calls == [len(prompt) - 3] and p.pos_max() == len(prompt) - 4
        p.begin(prompt)  # a new generation: the cache may hold anything (a loaded state)
        calls.clear()
        p.rollback(len(prompt) + 2)
        assert calls == [len(prompt) + 2]


def test_generation_unchanged_with_every_rollback_cut(tiny_config, tiny_draft):
    """The skipped draft seq_rm changes nothing: the same tokens and counts when every cut is made."""
    runs = []
    for force in (False, True):
        with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=3)) as eng:
            p = eng._dflash
            if force:
                real = type(p).rollback

                def always(n_past, _p=p, _real=real):
                    _p._cache_end = None
                    _real(_p, n_past)
                p.rollback = always
            prompt = eng.tokenize(PROMPT_TEXT)
            res = eng.generate(prompt, 40, ignore_eos=True)
            assert eng.target.pos_max() == p.pos_max()
            runs.append((res.tokens, res.stats.accepted, res.stats.drafted))
    assert runs[0] == runs[1]
