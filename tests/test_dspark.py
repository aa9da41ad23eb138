"""DSpark drafts: detection, anchor-first layout, the Markov head, confidence filtering."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from _equivalence import assert_same_tokens
from llama_dflash import LlamaDFlashDecoding, SpecConfig
from llama_dflash.errors import IncompatibleModelError
from llama_dflash.writer import write_random_draft
from spec_common import N_TOKENS, Recorder, check_every_accepted_length, ordinary_reference

BLOCK = 8
VARIANTS = {  # seed 10: confidences that cut blocks at several slots
    "conf_anchor": dict(confidence_head=True, sample_from_anchor=True, seed=10),
    "noconf_anchor": dict(confidence_head=False, sample_from_anchor=True, seed=5),
    "conf_bonus": dict(confidence_head=True, sample_from_anchor=False, seed=5),
}


@pytest.fixture(scope="module")
def dspark_drafts(tiny_dir, tiny_target):
    return {
        name: write_random_draft(str(tiny_dir / f"dspark_{name}.gguf"), tiny_target, block_size=BLOCK,
                                 markov_rank=8, **kw)
        for name, kw in VARIANTS.items()
    }


@pytest.fixture(scope="module")
def plain_twin(tiny_dir, tiny_target):
    """The same base weights as the DSpark drafts (seed 5), without the Markov head."""
    return write_random_draft(str(tiny_dir / "dspark_twin_dflash.gguf"), tiny_target, block_size=BLOCK, seed=5)


@pytest.fixture(scope="module")
def reference(tiny_target):
    from llama_dflash import TargetConfig

    return ordinary_reference(TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1))


def _engine(config, draft, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # clamping of n_max for the bonus-anchor layout
        return LlamaDFlashDecoding(config, SpecConfig(draft, **kw))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("n_draft", range(1, 9))
def test_greedy_output_matches_ordinary(tiny_config, dspark_drafts, reference, variant, n_draft):
    prompt, ref = reference
    with _engine(tiny_config, dspark_drafts[variant], draft_n_max=n_draft) as eng:
        assert eng.algorithm == "dspark"
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        assert res.stats.algorithm == "dspark"
        assert res.stats.drafted > 0
        assert eng.target.pos_max() == eng._dflash.pos_max()
        again = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert again.tokens == res.tokens and again.stats.drafted == res.stats.drafted  # same batches


def test_detection_and_forced_algorithm(tiny_config, dspark_drafts, tiny_draft):
    with pytest.raises(IncompatibleModelError, match="Markov"):
        LlamaDFlashDecoding(tiny_config, SpecConfig(dspark_drafts["conf_anchor"], algorithm="dflash"))
    with pytest.raises(IncompatibleModelError, match="Markov"):
        LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, algorithm="dspark"))
    with LlamaDFlashDecoding(tiny_config, SpecConfig(dspark_drafts["conf_anchor"], algorithm="dspark")) as eng:
        assert eng.algorithm == "dspark" and eng.draft_info.anchor_first


@pytest.mark.parametrize("variant,anchor_first", [("conf_anchor", True), ("conf_bonus", False)])
def test_block_layout(tiny_config, dspark_drafts, reference, monkeypatch, variant, anchor_first):
    """Anchor-first: [last, MASK x (n-1)] read at 0..n-1; bonus anchor: [last, MASK x n] read at 1..n."""
    prompt, _ = reference
    with _engine(tiny_config, dspark_drafts[variant], draft_n_max=BLOCK) as eng:
        p = eng._dflash
        assert p.n_max == (BLOCK if anchor_first else BLOCK - 1)
        blocks = []
        real = type(p)._draft_block

        def spy(self, id_last, n_past, n_block):
            toks = real(self, id_last, n_past, n_block)
            blocks.append((n_block, len(toks)))
            return toks

        monkeypatch.setattr(type(p), "_draft_block", spy)
        eng.generate(prompt, 12, ignore_eos=True)
        assert blocks
        for n_block, n_tok in blocks:
            assert n_block <= BLOCK
            assert n_tok == (n_block if anchor_first else n_block - 1)


def test_block_never_exceeds_block_size(tiny_config, dspark_drafts, reference):
    """Even with n_max forced past the block, the block stays within dflash.block_size."""
    prompt, ref = reference
    with _engine(tiny_config, dspark_drafts["conf_anchor"], draft_n_max=4) as eng:
        eng._dflash.n_max = 100
        rec = Recorder(eng._dflash)
        eng.use_proposer(rec)
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        assert max(len(b) for b in rec.blocks) == BLOCK


def _raw_block(p, id_last, n_past, n_block):
    """Decode a block on the draft and return (logits rows, confidences), cache left clean."""
    p.batch.set_block(id_last, p.mask, n_block, n_past)
    assert p.batch.decode(p.ctx.ptr) == 0
    try:
        rows = np.stack([np.array(p._logits(i)) for i in range(n_block)])
        from llama_dflash import _bindings as ext

        conf_p = ext.llama_get_embeddings_nextn(p.ctx.ptr)
        conf = np.array([conf_p[i * p.n_embd] for i in range(n_block)]) if conf_p is not None else None
    finally:
        p.ctx.seq_rm(0, n_past, -1)
    return rows, conf


def _prefilled(eng, prompt):
    """Prefill the prompt (all but the last token) into target and draft; returns (id_last, n_past)."""
    from llama_dflash.generate import prefill

    eng.target.clear()
    eng._dflash.clear()
    prefill(eng.target, prompt[:-1], eng._dflash.inject)
    eng._dflash.flush()
    return int(prompt[-1]), len(prompt) - 1


def test_markov_head_chain(tiny_config, dspark_drafts, plain_twin, reference):
    """slot i logits = base_i + markov_w2 . markov_w1[prev_i], prev_0 = anchor, prev_i = argmax of slot i-1."""
    from gguf import GGUFReader

    prompt, _ = reference
    r = GGUFReader(dspark_drafts["noconf_anchor"], "r")
    t = {x.name: np.array(x.data) for x in r.tensors}
    w1, w2 = t["markov_w1.weight"], t["markov_w2.weight"]  # [n_vocab, rank], [n_vocab_draft, rank]
    n_block = 5
    with _engine(tiny_config, plain_twin, backend_sampling=False) as base_eng:
        id_last, n_past = _prefilled(base_eng, prompt)
        base, _ = _raw_block(base_eng._dflash, id_last, n_past, n_block)
    with _engine(tiny_config, dspark_drafts["noconf_anchor"], backend_sampling=False) as eng:
        id_last, n_past = _prefilled(eng, prompt)
        rows, _ = _raw_block(eng._dflash, id_last, n_past, n_block)
    prev = id_last
    for i in range(n_block):
        expect = base[i] + w2 @ w1[prev]
        np.testing.assert_allclose(rows[i], expect, rtol=1e-4, atol=1e-4)
        prev = int(np.argmax(rows[i]))


def test_confidence_cut(tiny_config, dspark_drafts, reference):
    """The block stops at the first slot whose confidence is below p_min (CPU and backend paths)."""
    prompt, ref = reference
    with _engine(tiny_config, dspark_drafts["conf_anchor"], draft_n_max=BLOCK, draft_p_min=0.5,
                 backend_sampling=False) as eng:
        p = eng._dflash
        id_last, n_past = _prefilled(eng, prompt)
        rows, conf = _raw_block(p, id_last, n_past, BLOCK)
        assert conf is not None and np.all((conf >= 0) & (conf <= 1))
        greedy = [int(np.argmax(rows[i])) for i in range(BLOCK)]
        cuts = {}
        for p_min in sorted({float(c) + 1e-6 for c in conf} | {float(conf.min()) / 2}):
            expect = 0
            while expect < BLOCK and conf[expect] >= p_min:
                expect += 1
            p.p_min = p_min
            toks = p.propose(id_last, n_past, BLOCK)
            assert toks == greedy[:expect], p_min
            assert p.pos_max() == n_past - 1
            cuts[p_min] = toks
        assert len({len(t) for t in cuts.values()}) >= 3  # the fixture cuts at several slots
    with _engine(tiny_config, dspark_drafts["conf_anchor"], draft_n_max=BLOCK, draft_p_min=0.5,
                 backend_sampling=True) as eng:
        p = eng._dflash
        assert p.backend_sampling_active
        id_last, n_past = _prefilled(eng, prompt)
        for p_min, toks in cuts.items():
            p.p_min = p_min
            assert p.propose(id_last, n_past, BLOCK) == toks
        p.p_min = sorted(cuts)[len(cuts) // 2]
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        assert 0 < res.stats.drafted
        assert eng.target.pos_max() == eng._dflash.pos_max()


def test_confidence_values_spread(tiny_config, dspark_drafts, reference):
    """Sanity of the fixture: confidences vary, so the cut tests above cut at different slots."""
    prompt, _ = reference
    with _engine(tiny_config, dspark_drafts["conf_anchor"], backend_sampling=False) as eng:
        id_last, n_past = _prefilled(eng, prompt)
        _, conf = _raw_block(eng._dflash, id_last, n_past, BLOCK)
    assert conf.max() - conf.min() > 1e-3


def test_p_min_one_keeps_saturated_slots(tiny_config, dspark_drafts, reference):
    """p_min 1.0 is a strict `<` as in llama.cpp's driver: slots whose confidence is exactly 1.0
    (float32 saturation) are still drafted, the rest cut; output unchanged."""
    prompt, ref = reference
    with _engine(tiny_config, dspark_drafts["conf_anchor"], draft_n_max=BLOCK, draft_p_min=1.0,
                 backend_sampling=False) as eng:
        p = eng._dflash
        id_last, n_past = _prefilled(eng, prompt)
        rows, conf = _raw_block(p, id_last, n_past, BLOCK)
        expect = 0
        while expect < BLOCK and conf[expect] >= 1.0:
            expect += 1
        assert expect > 0, "the fixture should saturate its first confidence"
        greedy = [int(np.argmax(rows[i])) for i in range(BLOCK)]
        assert p.propose(id_last, n_past, BLOCK) == greedy[:expect]
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        assert res.stats.drafted > 0
        assert eng.target.pos_max() == eng._dflash.pos_max()


def test_missing_confidences_skip_the_filter(tiny_config, dspark_drafts, reference, monkeypatch):
    """A NULL confidence pointer (ctypes gives a falsy pointer, not None) drafts unfiltered, as
    llama.cpp's driver does, instead of raising "NULL pointer access"."""
    import ctypes

    from llama_dflash import _bindings as ext
    from llama_dflash.proposers import dflash as proposer_mod

    prompt, ref = reference
    with _engine(tiny_config, dspark_drafts["conf_anchor"], draft_n_max=BLOCK, backend_sampling=False) as eng:
        p = eng._dflash
        id_last, n_past = _prefilled(eng, prompt)
        unfiltered = p.propose(id_last, n_past, BLOCK)
        assert len(unfiltered) == BLOCK
        monkeypatch.setattr(proposer_mod.ext, "llama_get_embeddings_nextn",
                            lambda ctx: ctypes.POINTER(ctypes.c_float)())
        assert ext is proposer_mod.ext
        p.p_min = 0.999999
        assert p.propose(id_last, n_past, BLOCK) == unfiltered
        assert_same_tokens(eng.generate(prompt, N_TOKENS, ignore_eos=True).tokens, ref,
                           prompt=prompt, config=tiny_config)


def test_p_min_without_confidence_head_is_clear_error(tiny_config, dspark_drafts):
    with pytest.raises(ValueError, match="no confidence head"):
        LlamaDFlashDecoding(tiny_config, SpecConfig(dspark_drafts["noconf_anchor"], draft_p_min=0.5))
    # p_min 0 is fine
    with LlamaDFlashDecoding(tiny_config, SpecConfig(dspark_drafts["noconf_anchor"], draft_p_min=0.0)) as eng:
        assert not eng.draft_info.has_confidence_head


@pytest.mark.parametrize("variant", ["conf_anchor", "conf_bonus"])
def test_every_accepted_length(tiny_config, dspark_drafts, reference, variant):
    prompt, ref = reference
    with _engine(tiny_config, dspark_drafts[variant], draft_n_max=5) as eng:
        s = check_every_accepted_length(eng, prompt, ref, 5).stats
        assert s.rollbacks > 0 and 0 < s.accepted < s.verified
