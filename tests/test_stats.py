"""SpecStats: tau under both names, per-speculator counts added up, the preview's keys."""

from __future__ import annotations

import pytest

from llama_dflash.stats import SpecStats


def _steps(*pairs):
    s = SpecStats()
    for drafted, accepted in pairs:
        s.record_step(drafted, accepted)
    return s


def test_mean_accepted_length_is_tau_and_accepted_per_step_the_drafts():
    s = _steps((4, 2), (4, 0), (4, 4))  # 6 drafts accepted in 3 steps
    assert s.accepted_per_step == pytest.approx(2.0)
    assert s.tau == s.tokens_per_step == s.mean_accepted_length == pytest.approx(3.0)
    d = s.to_dict()
    assert d["mean_accepted_length"] == d["tau"] == pytest.approx(3.0) and d["accepted_per_step"] == 2.0
    assert SpecStats().mean_accepted_length == 0.0  # no step: no tau
    # tokens with no step counted (ordinary decoding): each was the target's own
    assert SpecStats(generated_tokens=5).tau == SpecStats(generated_tokens=5).to_dict()["tau"] == 1.0


def test_rates_of_the_decode_loop():
    s = SpecStats(generated_tokens=11, total_seconds=2.0, prefill_seconds=0.5, first_token_seconds=1.0)
    assert s.generation_tokens_per_second == pytest.approx(11 / 1.5)
    assert s.sustained_tokens_per_second == pytest.approx(10 / 1.0)
    assert SpecStats(generated_tokens=1, total_seconds=1.0, first_token_seconds=1.0).sustained_tokens_per_second == 0


def test_merge_adds_per_speculator_counts():
    a = SpecStats(speculators={"ngram-simple": {"drafts": 2, "drafted": 8, "accepted": 3,
                                               "accepted_per_position": [2, 1], "draft_seconds": 0.5}})
    b = SpecStats(speculators={"ngram-simple": {"drafts": 1, "drafted": 4, "accepted": 4,
                                               "accepted_per_position": [1, 1, 1, 1], "draft_seconds": 0.25},
                               "draft-dflash": {"drafts": 5, "drafted": 20, "accepted": 7}})
    a.merge(b)
    assert a.speculators["ngram-simple"] == {"drafts": 3, "drafted": 12, "accepted": 7,
                                             "accepted_per_position": [3, 2, 1, 1], "draft_seconds": 0.75}
    assert a.speculators["draft-dflash"] == {"drafts": 5, "drafted": 20, "accepted": 7}
    assert b.speculators["ngram-simple"]["drafts"] == 1  # the other run is left as it was


def test_merge_adds_target_split_and_shadow_counts():
    a = SpecStats(target_decode_seconds=1.0, target_sync_seconds=0.5, shadow_probes=2)
    a.merge(SpecStats(target_decode_seconds=2.0, target_sync_seconds=0.25, shadow_probes=1))
    assert (a.target_decode_seconds, a.target_sync_seconds, a.shadow_probes) == (3.0, 0.75, 3)


def test_preview_stats_keys_and_meanings():
    s = _steps((3, 3), (3, 1))
    s.first_token_seconds, s.draft_seconds = 0.125, 0.5
    p = s.preview_stats()
    assert p["mean_accepted_length"] == pytest.approx(3.0)
    assert p["acceptance_rate_per_position"] == [1.0, 0.5, 0.5]
    assert p["time_to_first_token_seconds"] == 0.125 and p["draft_seconds"] == 0.5
    for key in ("drafted", "verified", "accepted", "target_decode_seconds", "target_sync_seconds",
                "process_seconds", "rollbacks", "checkpoint_captures", "checkpoint_restores",
                "sustained_tokens_per_second", "generation_tokens_per_second"):
        assert key in p


def test_the_engine_splits_target_time_into_decode_and_sync(tiny_config, tiny_draft):
    from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig

    with OrdinaryDecoding(tiny_config) as o:
        prompt = o.tokenize("the quick brown fox")
        so = o.generate(prompt, 12, ignore_eos=True).stats
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=3)) as eng:
        ss = eng.generate(prompt, 12, ignore_eos=True).stats
    for s in (so, ss):
        assert s.target_decode_seconds > 0 and s.target_sync_seconds >= 0
        assert s.target_decode_seconds + s.target_sync_seconds == pytest.approx(s.target_seconds)
