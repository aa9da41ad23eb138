"""Reduced-vocabulary drafts: a `d2t` tensor maps the draft head's rows to target token ids."""

from __future__ import annotations

import numpy as np
import pytest

from _equivalence import assert_same_tokens
from llama_dflash import LlamaDFlashDecoding, SpecConfig, TargetConfig
from llama_dflash.inspect import read_gguf, validate_pair
from llama_dflash.writer import write_random_draft
from spec_common import N_TOKENS, Recorder, check_every_accepted_length, ordinary_reference

DRAFT_VOCAB = 48
VARIANTS = {
    "d2t": dict(),
    "d2t_own_embd": dict(with_embeddings=True),
    "d2t_dspark": dict(markov_rank=8, confidence_head=True),
}


@pytest.fixture(scope="module")
def d2t_drafts(tiny_dir, tiny_target):
    return {
        name: write_random_draft(str(tiny_dir / f"{name}.gguf"), tiny_target, block_size=16, seed=11,
                                 draft_vocab=DRAFT_VOCAB, **kw)
        for name, kw in VARIANTS.items()
    }


@pytest.fixture(scope="module")
def reference(tiny_target):
    return ordinary_reference(TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1))


def _d2t(path):
    from gguf import GGUFReader

    r = GGUFReader(path, "r")
    t = {x.name: x for x in r.tensors}
    assert t["d2t"].data.dtype == np.int64
    assert t["output.weight"].data.shape[0] == DRAFT_VOCAB
    return np.array(t["d2t"].data)


def test_fixture_layout(d2t_drafts, tiny_target):
    target = read_gguf(tiny_target)
    for name, path in d2t_drafts.items():
        d2t = _d2t(path)
        assert len(d2t) == DRAFT_VOCAB and len(set(d2t.tolist())) == DRAFT_VOCAB
        assert d2t.min() >= 0 and d2t.max() < target.n_vocab
        info = validate_pair(target, read_gguf(path))
        assert info.reduced_vocab == DRAFT_VOCAB
        assert info.algorithm == ("dspark" if "dspark" in name else "dflash")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("n_draft", range(1, 9))
def test_greedy_output_matches_ordinary_and_ids_are_target_ids(tiny_config, d2t_drafts, reference, variant, n_draft):
    prompt, ref = reference
    allowed = set(_d2t(d2t_drafts[variant]).tolist())
    with LlamaDFlashDecoding(tiny_config, SpecConfig(d2t_drafts[variant], draft_n_max=n_draft)) as eng:
        rec = Recorder(eng._dflash)
        eng.use_proposer(rec)
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        drafted = [t for b in rec.blocks for t in b]
        assert drafted and set(drafted) <= allowed
        assert eng.target.pos_max() == eng._dflash.pos_max()


@pytest.mark.parametrize("variant", ["d2t", "d2t_dspark"])
def test_logits_scattered_to_target_ids(tiny_config, d2t_drafts, reference, variant):
    """Rows outside d2t are -inf; the draft's argmax is a target id from d2t."""
    from llama_dflash.generate import prefill

    prompt, _ = reference
    d2t = _d2t(d2t_drafts[variant])
    with LlamaDFlashDecoding(tiny_config, SpecConfig(d2t_drafts[variant], backend_sampling=False)) as eng:
        p = eng._dflash
        prefill(eng.target, prompt[:-1], p.inject)
        p.flush()
        n_past = len(prompt) - 1
        p.batch.set_block(prompt[-1], p.mask, 4, n_past)
        assert p.batch.decode(p.ctx.ptr) == 0
        try:
            for i in range(4):
                row = np.array(p._logits(i))
                outside = np.ones(row.shape[0], dtype=bool)
                outside[d2t] = False
                assert np.all(np.isneginf(row[outside]))
                assert np.all(np.isfinite(row[d2t]))
                assert int(np.argmax(row)) in set(d2t.tolist())
        finally:
            p.ctx.seq_rm(0, n_past, -1)


def test_backend_and_cpu_drafts_identical(tiny_config, d2t_drafts, reference):
    prompt, ref = reference
    blocks = {}
    for bs in (False, True):
        with LlamaDFlashDecoding(tiny_config, SpecConfig(d2t_drafts["d2t_dspark"], draft_n_max=6,
                                                         backend_sampling=bs)) as eng:
            rec = Recorder(eng._dflash)
            eng.use_proposer(rec)
            res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
            assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
            assert res.stats.backend_sampling_active == bs
            blocks[bs] = rec.blocks
    assert blocks[False] == blocks[True]


def test_every_accepted_length(tiny_config, d2t_drafts, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(tiny_config, SpecConfig(d2t_drafts["d2t"], draft_n_max=5)) as eng:
        s = check_every_accepted_length(eng, prompt, ref, 5).stats
        assert s.rollbacks > 0 and 0 < s.accepted < s.verified


@pytest.mark.parametrize("case", ["out_of_range", "repeated", "no_head", "short_head"])
def test_bad_d2t_is_a_clear_error(tiny_dir, tiny_target, case):
    """llama.cpp would abort (or scatter out of range): validation names the problem first."""
    from llama_dflash.errors import IncompatibleModelError
    from llama_dflash.writer import DraftShape, evenly_spread_layers, random_draft_weights, write_draft

    target = read_gguf(tiny_target)
    shape = DraftShape(n_embd=target.n_embd, n_head=4, n_head_kv=2, block_size=8,
                       target_layers=evenly_spread_layers(target.n_layer))
    rows = 32
    d2t = np.arange(rows, dtype=np.int64) * 3
    weights = random_draft_weights(shape, target.n_vocab, n_vocab_draft=rows)
    if case == "out_of_range":
        d2t[-1] = target.n_vocab
    elif case == "repeated":
        d2t[1] = d2t[0]
    elif case == "no_head":
        del weights["output.weight"]
    elif case == "short_head":
        weights["output.weight"] = weights["output.weight"][:-1]
    path = write_draft(str(tiny_dir / f"bad_d2t_{case}.gguf"), shape, weights, tokenizer_from=tiny_target,
                       mask_token_id=3, d2t=d2t)
    with pytest.raises(IncompatibleModelError, match="d2t|output.weight"):
        validate_pair(target, read_gguf(path))
