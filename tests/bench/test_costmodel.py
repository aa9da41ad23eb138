"""The per-phase table, tau and the cost model, on hand-made statistics (pure arithmetic, no model)."""

from __future__ import annotations

import pytest

from llama_dflash.bench.costmodel import StepCosts, build_cost_model, phase_table, run_step_costs
from llama_dflash.stats import SpecStats


def _ordinary() -> SpecStats:
    # 100 tokens, decode loop 1.0 s (t_ord 10 ms), of which 0.9 s target decode (T1 9 ms)
    return SpecStats(algorithm="ordinary", generated_tokens=100, verification_steps=100, target_seconds=0.9,
                     sample_seconds=0.03, prefill_seconds=0.1, total_seconds=1.1)


def _spec_k2() -> SpecStats:
    # 50 steps drafting 2 tokens; slot 1 accepted in 25 steps, slot 2 in 10: tau = 1 + 35/50
    s = SpecStats(draft_n_max=2, generated_tokens=85, draft_steps=50, draft_seconds=0.25, target_seconds=0.75,
                  process_seconds=0.05, sample_seconds=0.02, prefill_seconds=0.1, total_seconds=1.2)
    for _ in range(25):
        s.record_step(2, 1)
    for _ in range(10):
        s.record_step(2, 2)
    for _ in range(15):
        s.record_step(2, 0)
    s.accepted_per_position = [35, 10]  # slot 1 is accepted whenever slot 2 is
    s.accepted = 45
    return s


def test_tau_is_tokens_per_step_and_accepted_per_step_beside_it():
    s = SpecStats()
    assert s.tokens_per_step == 0.0  # no step yet
    for n_acc in (0, 1, 3):
        s.record_step(4, n_acc)
    assert s.accepted_per_step == pytest.approx(4 / 3)
    assert s.tokens_per_step == pytest.approx(1 + 4 / 3)
    d = s.to_dict()
    assert d["tokens_per_step"] == pytest.approx(1 + 4 / 3) and d["accepted_per_step"] == pytest.approx(4 / 3)


def test_phases_sum_to_the_decode_loop():
    s = _spec_k2()
    ph = s.phase_seconds()
    assert sum(ph.values()) == pytest.approx(s.total_seconds - s.prefill_seconds)
    assert ph["python"] == pytest.approx(1.1 - 0.25 - 0.05 - 0.75 - 0.02)


def test_phase_table_in_ordinary_decodes():
    t = phase_table(_ordinary(), {2: _spec_k2()})
    assert t["unit_seconds"] == pytest.approx(0.009)
    assert t["ordinary"]["verify"] == pytest.approx(1.0)
    row = t["draft_tokens"]["2"]
    assert row["draft"] == pytest.approx(0.25 / 50 / 0.009)
    assert row["verify"] == pytest.approx(0.75 / 50 / 0.009)
    assert row["total"] == pytest.approx(1.1 / 50 / 0.009)
    assert row["tokens_per_step"] == pytest.approx(85 / 50)


def test_cost_model_predicts_every_probed_k_and_blames_acceptance():
    costs = StepCosts(draft={1: 0.004, 2: 0.005}, verify={1: 0.012, 2: 0.015})
    m = build_cost_model(_ordinary(), {2: _spec_k2()}, costs)
    # extras per step of the k=2 run: (1.1 - 0.25 - 0.75) / 50 = 2 ms
    p1, p2 = m.predictions
    assert (p1.k, p2.k) == (1, 2)
    assert p1.tokens_per_step == pytest.approx(1.7) and p1.step_cost == pytest.approx(1.8)
    assert p2.tokens_per_step == pytest.approx(1.9) and p2.step_cost == pytest.approx(2.2)
    assert p2.speedup == pytest.approx(1.9 / 2.2) and p2.ceiling == pytest.approx(3 / 2.2)
    assert m.best.k == 1
    assert "acceptance" in m.verdict and "verification" not in m.verdict
    d = m.to_dict()
    assert d["best_k"] == 1 and d["best_predicted_speedup"] == pytest.approx(1.7 / 1.8)


def test_cost_model_blames_verification_when_even_a_perfect_draft_loses():
    costs = StepCosts(draft={1: 0.01, 2: 0.012}, verify={1: 0.03, 2: 0.04})
    m = build_cost_model(_ordinary(), {2: _spec_k2()}, costs)
    assert max(p.ceiling for p in m.predictions) < 1
    assert m.verdict.startswith("no draft length can win: verification cost")


def test_cost_model_says_when_drafting_pays():
    costs = StepCosts(draft={1: 0.001, 2: 0.001}, verify={1: 0.01, 2: 0.011})
    m = build_cost_model(_ordinary(), {2: _spec_k2()}, costs)
    assert m.best.speedup > 1 and m.verdict.startswith("drafting pays")


def test_no_acceptance_beyond_the_drafted_positions():
    costs = StepCosts(draft={k: 0.004 for k in (1, 2, 3)}, verify={k: 0.012 for k in (1, 2, 3)})
    m = build_cost_model(_ordinary(), {2: _spec_k2()}, costs)
    assert [p.k for p in m.predictions] == [1, 2]  # nobody drafted a third slot


def test_costs_from_the_runs_when_there_is_no_probe():
    c = run_step_costs({2: _spec_k2(), "auto": _spec_k2()})
    assert c.source == "runs" and c.ks() == [2]
    assert c.draft[2] == pytest.approx(0.005) and c.verify[2] == pytest.approx(0.015)
    m = build_cost_model(_ordinary(), {2: _spec_k2()}, c)
    assert m.costs_source == "runs" and [p.k for p in m.predictions] == [2]


def test_a_probed_ordinary_decode_sets_the_ordinary_token_cost():
    # probe: 8 ms per ordinary decode; the loop adds 10 - 9 = 1 ms per token of sampling and Python
    costs = StepCosts(draft={1: 0.004}, verify={1: 0.012}, ordinary=0.008)
    m = build_cost_model(_ordinary(), {2: _spec_k2()}, costs)
    assert m.ordinary_seconds == pytest.approx(0.009)
    assert m.predictions[0].step_cost == pytest.approx(0.018 / 0.009)
