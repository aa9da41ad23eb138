"""Backend-side top-k candidate sampling on the draft context, and its CPU fallback.

`tiny_config` offloads every layer where the build can, so on a GPU build the chain samples on the
device (`gpu`-marked tests); output is compared with `assert_same_tokens` (exact on the CPU).
Backend sampling on or off reads the same draft logits, so the blocks must agree on any device.
"""

from __future__ import annotations

import logging
import warnings

import pytest
from llama_cpp import llama_cpp as ll

from _equivalence import assert_same_tokens
from llama_dflash import LlamaDFlashDecoding, SpecConfig, TargetConfig
from llama_dflash.proposers import dflash as proposer_mod
from llama_dflash.writer import write_random_draft
from spec_common import N_TOKENS, Recorder, check_every_accepted_length, ordinary_reference


@pytest.fixture(scope="module")
def drafts(tiny_dir, tiny_target, tiny_draft):
    return {
        "dflash": tiny_draft,
        "dspark": write_random_draft(str(tiny_dir / "bs_dspark.gguf"), tiny_target, block_size=8, seed=10,
                                     markov_rank=8, confidence_head=True),
        "d2t": write_random_draft(str(tiny_dir / "bs_d2t.gguf"), tiny_target, block_size=8, seed=12,
                                  draft_vocab=40),
    }


@pytest.fixture(scope="module")
def reference(tiny_target):
    return ordinary_reference(TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1))


@pytest.fixture()
def fresh_reports(monkeypatch):
    monkeypatch.setattr(proposer_mod, "_reported_fallbacks", set())


def _run(config, draft, prompt, **kw):
    with LlamaDFlashDecoding(config, SpecConfig(draft, **kw)) as eng:
        rec = Recorder(eng._dflash)
        eng.use_proposer(rec)
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert eng.target.pos_max() == eng._dflash.pos_max()
        return res, rec.blocks, eng._dflash.backend_sampling_active


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["dflash", "dspark", "d2t"])
@pytest.mark.parametrize("n_draft", [1, 3, 7])
@pytest.mark.parametrize("p_min", [0.0, 0.3])
def test_on_off_identical(tiny_config, drafts, reference, kind, n_draft, p_min):
    prompt, ref = reference
    out = {}
    for bs in (True, False):
        res, blocks, active = _run(tiny_config, drafts[kind], prompt, draft_n_max=n_draft, draft_p_min=p_min,
                                   backend_sampling=bs)
        assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
        assert active == bs
        assert res.stats.backend_sampling_requested == bs
        assert res.stats.backend_sampling_active == bs
        out[bs] = (blocks, res.stats.drafted, res.stats.accepted)
    assert out[True] == out[False]
    if p_min == 0.0:
        assert out[True][1] > 0


def test_repeated_runs_identical(tiny_config, drafts, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(tiny_config, SpecConfig(drafts["dspark"], draft_n_max=6, backend_sampling=True)) as eng:
        a = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        b = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        assert a.tokens == b.tokens
        assert_same_tokens(a.tokens, ref, prompt=prompt, config=tiny_config)
        assert a.stats.drafted == b.stats.drafted and a.stats.accepted == b.stats.accepted
        assert a.stats.backend_sampling_active and b.stats.backend_sampling_active


@pytest.mark.gpu
def test_every_accepted_length_with_backend_sampling(tiny_config, drafts, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(tiny_config, SpecConfig(drafts["dflash"], draft_n_max=5, backend_sampling=True)) as eng:
        assert eng._dflash.backend_sampling_active
        check_every_accepted_length(eng, prompt, ref, 5)


def test_refused_attach_falls_back_and_logs_once(tiny_config, drafts, reference, monkeypatch, fresh_reports, caplog):
    prompt, ref = reference
    monkeypatch.setattr(ll, "llama_set_sampler", lambda ctx, seq, smpl: False)
    with caplog.at_level(logging.WARNING, logger="llama_dflash"):
        with pytest.warns(RuntimeWarning, match="CPU path"):
            res, _, active = _run(tiny_config, drafts["dspark"], prompt, draft_n_max=4, backend_sampling=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # reported once: no second warning
            res2, _, _ = _run(tiny_config, drafts["dspark"], prompt, draft_n_max=4, backend_sampling=True)
    assert not active
    assert res.tokens == res2.tokens
    assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
    assert res.stats.backend_sampling_requested and not res.stats.backend_sampling_active
    msgs = [r.getMessage() for r in caplog.records if "CPU path" in r.getMessage()]
    assert len(msgs) == 1 and "llama_set_sampler" in msgs[0]


def test_missing_results_at_run_time_fall_back(tiny_config, drafts, reference, monkeypatch, fresh_reports):
    prompt, ref = reference
    monkeypatch.setattr(ll, "llama_get_sampled_candidates_ith", lambda ctx, i: None)
    with pytest.warns(RuntimeWarning, match="no sampled candidates"):
        with LlamaDFlashDecoding(tiny_config, SpecConfig(drafts["dflash"], draft_n_max=4,
                                                         backend_sampling=True)) as eng:
            assert eng._dflash.backend_sampling_active
            res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
            assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
            assert not eng._dflash.backend_sampling_active
            assert not res.stats.backend_sampling_active
            assert res.stats.drafted > 0
            assert eng.target.pos_max() == eng._dflash.pos_max()
    # and the same blocks as the plain CPU path
    off, _, _ = _run(tiny_config, drafts["dflash"], prompt, draft_n_max=4, backend_sampling=False)
    assert off.stats.drafted == res.stats.drafted


@pytest.mark.gpu
def test_chain_detached_and_freed_before_context(tiny_config, drafts, monkeypatch):
    calls = []
    real_set, real_free, real_ctx_free = ll.llama_set_sampler, ll.llama_sampler_free, ll.llama_free
    monkeypatch.setattr(ll, "llama_set_sampler", lambda c, s, smpl: calls.append(("set", smpl is None)) or real_set(c, s, smpl))
    monkeypatch.setattr(ll, "llama_sampler_free", lambda smpl: calls.append(("free",)) or real_free(smpl))
    monkeypatch.setattr(ll, "llama_free", lambda c: calls.append(("ctx_free",)) or real_ctx_free(c))
    eng = LlamaDFlashDecoding(tiny_config, SpecConfig(drafts["dflash"], draft_n_max=3, backend_sampling=True))
    p = eng._dflash
    assert p.backend_sampling_active and p._chain is not None
    calls.clear()
    eng.close()
    eng.close()
    assert p._chain is None and not p.backend_sampling_active
    # detach (set NULL) then free the chain, then the draft context, then the target's
    assert calls[:3] == [("set", True), ("free",), ("ctx_free",)]
    assert calls.count(("free",)) == 1


@pytest.mark.gpu
def test_closing_the_context_directly_detaches(tiny_config, drafts):
    """Whoever frees the draft context (here: the context handle itself), the chain goes first."""
    with LlamaDFlashDecoding(tiny_config, SpecConfig(drafts["dflash"], draft_n_max=3, backend_sampling=True)) as eng:
        p = eng._dflash
        assert p._chain is not None
        p.ctx.close()
        assert p._chain is None and not p.backend_sampling_active


@pytest.mark.gpu
@pytest.mark.parametrize("gpu,ngl,attached", [(False, -1, False), (True, -1, True), (True, 0, False)])
def test_auto_attaches_only_where_the_draft_runs_on_a_gpu(tiny_config, drafts, reference, monkeypatch,
                                                          fresh_reports, gpu, ngl, attached):
    """The default ("auto"): on the CPU reading the draft's rows costs less than a top-k in its
    graph (bench/draft_cost.py: 2.1 vs 3.1 ms per block of the default draft), so the chain is
    attached only on a GPU build with the draft offloaded; no warning either way, same blocks."""
    prompt, ref = reference
    monkeypatch.setattr(ll, "llama_supports_gpu_offload", lambda: gpu)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res, blocks, active = _run(tiny_config, drafts["dflash"], prompt, draft_n_max=4, draft_n_gpu_layers=ngl)
    assert active is attached
    assert res.stats.backend_sampling_requested and res.stats.backend_sampling_active is attached
    assert_same_tokens(res.tokens, ref, prompt=prompt, config=tiny_config)
    off, off_blocks, _ = _run(tiny_config, drafts["dflash"], prompt, draft_n_max=4, backend_sampling=False)
    assert blocks == off_blocks and res.stats.drafted == off.stats.drafted > 0


def test_auto_is_the_default():
    assert SpecConfig("d.gguf").backend_sampling == "auto"
