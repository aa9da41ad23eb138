"""`llama-dflash bench` end to end on the tiny pair, and its JSON contract."""

from __future__ import annotations

import json
import subprocess
import sys

from _equivalence import assert_same_tokens
from llama_dflash import TargetConfig
from llama_dflash._llama import Model
from llama_dflash.bench.runner import first_divergence


def test_bench_json_contract(tmp_path, tiny_target, tiny_draft):
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", tiny_target, "--draft-model", tiny_draft,
         "--max-tokens", "24", "--runs", "2", "--warmup-tokens", "4", "--draft-tokens", "3", "--n-ctx", "256",
         "--n-batch", "64", "--n-ubatch", "64", "--ignore-eos", "--raw-prompt", "--prompt", "the and is",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    d = json.loads(out.read_text())
    plain, spec = (d[mode]["runs"][0]["output_tokens"] for mode in ("ordinary", "speculative"))
    same = plain == spec
    for block in ("[ordinary]", "[dflash]", "[comparison: dflash vs ordinary]", f"output tokens match : {same}",
                  "runs deterministic  : True", "first divergence    : " + ("none" if same else ""), "draft rollbacks"):
        assert block in proc.stdout
    # the bench offloads every layer where it can: exact on the CPU, on a GPU as the hardware promises
    with Model(tiny_target, n_gpu_layers=0) as m:
        prompt = m.tokenize("the and is")
    assert len(prompt) == d["settings"]["prompt_tokens"]
    assert_same_tokens(spec, plain, prompt=prompt, config=TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64),
                       what="bench speculative output")
    for mode in ("ordinary", "speculative"):
        assert len(d[mode]["runs"]) == 2
        for run in d[mode]["runs"]:
            assert set(run) >= {"tokens", "seconds", "tokens_per_second", "output_tokens"}
            assert run["tokens"] == 24 == len(run["output_tokens"])
            assert abs(run["tokens_per_second"] - run["tokens"] / run["seconds"]) < 1e-6
        assert d[mode]["aggregate_tokens_per_second"] > 0
    s = d["speculative"]["stats"]
    assert s["verification_steps"] > 0 and s["drafted"] == s["verified"]
    assert s["generated_tokens"] == 48
    c = d["comparison"]
    assert c["output_tokens_match"] is same and c["runs_deterministic"] is True
    assert c["first_divergence"] == first_divergence(plain, spec)
    ratio = d["speculative"]["aggregate_tokens_per_second"] / d["ordinary"]["aggregate_tokens_per_second"]
    assert abs(c["speedup"] - ratio) < 1e-9


def test_example_module_runs_bench(tiny_target, tiny_draft):
    proc = subprocess.run(
        [sys.executable, "-m", "examples.high_level_api.high_level_api_dflash_dspark_speculative",
         "--model", tiny_target, "--draft-model", tiny_draft, "--max-tokens", "8", "--runs", "1",
         "--warmup-tokens", "0", "--n-ctx", "256", "--n-batch", "64", "--n-ubatch", "64"],
        capture_output=True, text=True, timeout=300, cwd=__file__.rsplit("/tests/", 1)[0],
    )
    assert proc.returncode == 0, proc.stderr
    assert "[comparison: dflash vs ordinary]" in proc.stdout


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 3


def test_no_subcommand_is_usage_error():
    proc = subprocess.run([sys.executable, "-m", "llama_dflash.cli"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
