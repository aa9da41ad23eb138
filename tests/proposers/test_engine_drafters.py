"""Every speculator and chain in the engine: greedy output identical to ordinary decoding."""

from __future__ import annotations

import pytest

from _equivalence import assert_same_tokens
from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig

N_TOKENS = 120
# small n-gram sizes so that the tiny target's short history gives the map types matches
SMALL = dict(ngram_size_n=2, ngram_size_m=8)

TOKEN_TYPES = [
    ("ngram-simple", SMALL),
    ("ngram-map-k", SMALL),
    ("ngram-map-k4v", SMALL),
    ("ngram-mod", {}),
    ("ngram-cache", {}),
    ("lookup", {}),
    ("ngram-simple", {}),  # llama.cpp's default sizes
]


@pytest.fixture()
def repeated(tiny_config):
    with OrdinaryDecoding(tiny_config) as o:
        prompt = o.tokenize(" ".join([PROMPT_TEXT] * 4))
        res = o.generate(prompt, N_TOKENS, ignore_eos=True)
    return prompt, res.tokens


@pytest.mark.parametrize("spec_type,extra", TOKEN_TYPES)
def test_token_drafters_alone_give_the_ordinary_tokens(tiny_config, repeated, spec_type, extra):
    prompt, ref = repeated
    with LlamaDFlashDecoding(tiny_config, SpecConfig(spec_type=spec_type, **extra)) as eng:
        assert eng.draft_info is None and eng.algorithm == spec_type
        for _ in range(2):  # the second run starts from what the first left (n-gram caches persist)
            res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
            assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
            s = res.stats
            assert s.generated_tokens == N_TOKENS and s.verified == s.drafted
            assert set(s.speculators) == {spec_type}
            assert s.speculators[spec_type]["drafted"] == s.drafted
            assert s.speculators[spec_type]["accepted"] == s.accepted


def test_the_lookup_drafts_on_a_repeated_prompt(tiny_config, repeated):
    prompt, ref = repeated
    with LlamaDFlashDecoding(tiny_config, SpecConfig(spec_type="lookup")) as eng:
        s = eng.generate(prompt, N_TOKENS, ignore_eos=True).stats
    assert s.drafted > 0 and s.accepted > 0
    assert s.verification_steps < N_TOKENS


@pytest.mark.parametrize("chain", ["ngram-map-k,draft-dflash", "ngram-simple,draft-dflash",
                                   "lookup,draft-dflash", "ngram-cache,ngram-mod,draft-dflash"])
@pytest.mark.parametrize("n_draft", [1, 4])
def test_chains_with_the_draft_model_give_the_ordinary_tokens(tiny_config, tiny_draft, repeated, chain, n_draft):
    prompt, ref = repeated
    extra = SMALL if "ngram-map-k" in chain or "ngram-simple" in chain else {}
    spec = SpecConfig(tiny_draft, spec_type=chain, draft_n_max=n_draft, **extra)
    with LlamaDFlashDecoding(tiny_config, spec) as eng:
        # llama.cpp's fixed priority, whatever order the list was given in
        order = tuple(sorted(chain.split(","), key=["ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache",
                                                     "lookup", "draft-dflash"].index))
        assert eng.speculator_names == order
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        s = res.stats
        assert tuple(s.speculators) == order
        assert sum(v["drafted"] for v in s.speculators.values()) == s.drafted == s.verified
        assert sum(v["accepted"] for v in s.speculators.values()) == s.accepted
        # the draft model's cache kept up with the target whoever drafted
        assert eng.target.pos_max() == eng._dflash.pos_max()


def test_a_chain_keeps_the_draft_features_current(tiny_config, tiny_draft, repeated):
    """Steps drafted by the n-gram member still inject every verified row, so the draft model's
    proposals are those of the draft alone at the same positions: same tokens either way, and
    the draft model is asked only on steps the n-gram member had nothing."""
    prompt, ref = repeated
    spec = SpecConfig(tiny_draft, spec_type="ngram-simple,draft-dflash", draft_n_max=3, **SMALL)
    with LlamaDFlashDecoding(tiny_config, spec) as eng:
        s = eng.generate(prompt, N_TOKENS, ignore_eos=True).stats
    counts = s.speculators
    assert counts["ngram-simple"]["drafts"] > 0, "the test needs n-gram drafts to mean anything"
    n_gram = counts["ngram-simple"]
    assert n_gram["draft_calls"] >= s.verification_steps - 1  # (the last step may have no room)
    assert counts["draft-dflash"]["draft_calls"] == n_gram["draft_calls"] - n_gram["drafts"]


def test_spec_type_none_is_ordinary_decoding(tiny_config):
    with pytest.raises(ValueError, match="OrdinaryDecoding"):
        LlamaDFlashDecoding(tiny_config, SpecConfig(spec_type="none"))


def test_draft_n_max_of_a_token_only_engine(tiny_config):
    with LlamaDFlashDecoding(tiny_config, SpecConfig(spec_type="ngram-simple")) as eng:
        assert eng.draft_n_max == 48
        with pytest.raises(ValueError, match="model drafting alone"):
            eng.set_draft_n_max(4)
