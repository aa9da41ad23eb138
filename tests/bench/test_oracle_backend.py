"""The oracle ceiling, the cost tables in a real run, and the backend the bench reports (tiny pair)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import PROMPT_TEXT
from llama_dflash import SpecConfig
from llama_dflash.bench.backend import backend_info, offload_warning
from llama_dflash.bench.format import format_result
from llama_dflash.bench.oracle import oracle_script
from llama_dflash.bench.report import parse_report
from llama_dflash.bench.runner import BenchConfig, run_benchmark

TINY = ["--n-ctx", "256", "--n-batch", "64", "--n-ubatch", "64", "--raw-prompt", "--warmup-tokens", "4",
        "--threads", "1"]


def test_oracle_script_proposes_the_tokens_after_n_past():
    script = oracle_script(5, [10, 11, 12, 13])
    assert script(4, 2) == [10, 11]  # last prompt token at position 4: generated token 0 next
    assert script(6, 3) == [12, 13]  # cut at the end of the reference
    assert script(9, 2) == [] and script(2, 2) == []


@pytest.fixture(scope="module")
def oracle_result(tiny_target, tiny_draft):
    from llama_dflash import TargetConfig

    cfg = BenchConfig(TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1),
                      SpecConfig(tiny_draft, draft_n_max=3), PROMPT_TEXT, max_tokens=20, warmup_tokens=4, runs=2,
                      ignore_eos=True, oracle=True)
    return run_benchmark(cfg)


def test_oracle_accepts_every_proposal_and_keeps_the_output(oracle_result):
    r = oracle_result
    o = r.oracle.stats
    assert r.oracle_draft_tokens == 3
    assert o.drafted > 0 and o.accepted == o.verified == o.drafted  # greedy: every proposal right
    assert o.draft_steps == o.verification_steps  # the real draft block still ran every step
    assert o.draft_seconds > 0
    assert all(run.output_tokens == r.ordinary.runs[0].output_tokens for run in r.oracle.runs)
    assert r.oracle.stats.tokens_per_step > 3  # 4 tokens a step but the last, cut by max_tokens
    # the engine is back on its real draft: the speculative runs kept their own acceptance
    assert r.speculative.stats.accepted < r.speculative.stats.verified


def test_json_and_text_carry_phases_cost_model_and_oracle(oracle_result):
    d = json.loads(json.dumps(oracle_result.to_dict()))
    assert d["comparison"]["oracle_speedup"] == pytest.approx(oracle_result.oracle_speedup)
    assert set(d["phases"]["draft_tokens"]) == {"3", "oracle 3"}
    assert d["phases"]["ordinary"]["verify"] == pytest.approx(1.0)
    assert d["step_costs"]["source"] == "probe" and set(d["step_costs"]["verify"]) == {str(k) for k in range(1, 16)}
    assert [p["k"] for p in d["cost_model"]["predictions"]] == [1, 2, 3]
    assert set(d["cost_model"]["measured_decode_speedup"]) == {"3"}
    assert set(d["cost_model"]["oracle_decode_speedup"]) == {"3"}
    assert d["cost_model"]["summary"].startswith("predicted ") and "measured" in d["cost_model"]["summary"]
    assert d["speculative"]["stats"]["tokens_per_step"] == pytest.approx(
        1 + d["speculative"]["stats"]["accepted_per_step"])
    assert d["backend"]["backend"] == backend_info().name
    text = format_result(oracle_result)
    for needle in ("tokens per step (tau)", "accepted per step", "oracle ceiling", "[per-step cost by phase",
                   "[cost model", "verdict", "Backend        : "):
        assert needle in text


def test_backend_info_lists_the_devices():
    info = backend_info()
    assert info.devices and any(d.kind == "CPU" for d in info.devices)
    assert info.name in {d.backend for d in info.gpus} | {"CPU"} or "+" in info.name
    if not info.gpus:
        assert (info.name, info.gpu, info.gpu_memory) == ("CPU", "none", "none")
    assert offload_warning(0, info) is None
    assert "CPU" in info.summary()


@pytest.mark.skipif(backend_info().gpu_offload, reason="this build can offload to a GPU")
def test_offload_on_a_cpu_build_is_warned_on_stderr_and_in_the_report(tmp_path, tiny_target, tiny_draft):
    report = tmp_path / "r.md"
    base = [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", tiny_target, "--draft-model", tiny_draft,
            *TINY, "--max-tokens", "4", "--runs", "1", "--draft-tokens", "2", "--no-cost-probe"]
    proc = subprocess.run([*base, "--n-gpu-layers", "99", "--report", str(report)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "--n-gpu-layers asks to offload 99 layers, but this llama-cpp-python build has no GPU backend" in proc.stderr
    fields = parse_report(report.read_text())[0]
    assert (fields["Backend"], fields["GPU"], fields["GPU memory"]) == ("CPU", "none", "none")
    assert "--n-gpu-layers asks to offload" in fields["Errors or warnings"]
    quiet = subprocess.run(base, capture_output=True, text=True, timeout=300)  # default: no warning
    assert quiet.returncode == 0 and "--n-gpu-layers" not in quiet.stderr
