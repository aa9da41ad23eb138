"""`draft-mtp`: the target's own MTP head as a speculator, everywhere the other types are (issue 41
item 3).  Step parity with llama.cpp's driver is in tests/test_arch_parity.py; here: the drop-in
`Llama`, chains and auto, the CLI and the server, and the refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import llama_cpp
import pytest

from llama_dflash import Llama, LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, SpeculativeType, TargetConfig
from llama_dflash.errors import IncompatibleModelError
from llama_dflash.testing.drafts import write_rigged_draft
from llama_dflash.testing.targets import write_target

PROMPT = "the quick brown fox and the lazy dog is"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    fx = write_target(str(root / "qwen35.gguf"), "qwen35", mtp=True)
    return {"target": fx.path, "dspark": write_rigged_draft(str(root / "d.gguf"), fx, "dspark"),
            "plain": write_target(str(root / "plain.gguf"), "qwen35").path}


def _cfg(path: str) -> TargetConfig:
    return TargetConfig(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)


@pytest.mark.parametrize("spec_type", ["draft-mtp", "ngram-mod,draft-mtp", "draft-mtp,draft-dspark",
                                       "auto,draft-mtp", "auto,draft-mtp,draft-dspark"])
def test_engine_chains_and_auto_with_the_mtp_head(files, spec_type):
    with OrdinaryDecoding(_cfg(files["target"])) as o:
        ref = o.generate(o.tokenize(PROMPT), 64).tokens
    draft = files["dspark"] if "dspark" in spec_type else None
    with LlamaDFlashDecoding(_cfg(files["target"]), SpecConfig(draft, spec_type=spec_type, draft_n_max=4)) as eng:
        res = eng.generate(eng.tokenize(PROMPT), 64)
        stats = eng.last_stats
    assert res.tokens == ref
    assert stats.algorithm == spec_type
    if not spec_type.startswith("auto"):
        assert 0 < stats.accepted < stats.drafted
    if "," in spec_type:  # chains and auto count per speculator: the MTP head drafted
        assert stats.speculators["draft-mtp"]["draft_calls"] > 0


def test_the_drop_in_llama_drafts_with_the_mtp_head(files):
    kw = dict(n_ctx=512, n_batch=64, n_threads=2, verbose=False, flash_attn=True)
    ref = llama_cpp.Llama(files["target"], **kw)
    want = ref.create_completion(PROMPT, max_tokens=48, temperature=0.0)["choices"][0]["text"]
    ref.close()
    with Llama(files["target"], speculative=SpecConfig(spec_type=SpeculativeType.DRAFT_MTP, draft_n_max=4), **kw) as llm:
        out = llm.create_completion(PROMPT, max_tokens=48, temperature=0.0)
        preview = llm.last_speculative_stats
    assert out["choices"][0]["text"] == want
    assert out["speculative"]["algorithm"] == "draft-mtp"
    assert 0 < preview["accepted"] < preview["drafted"]
    assert preview["mean_accepted_length"] > 1.0


def test_a_target_without_an_mtp_head_is_refused(files):
    with pytest.raises(IncompatibleModelError, match=r"qwen35\.nextn_predict_layers.*MTP head"):
        LlamaDFlashDecoding(_cfg(files["plain"]), SpecConfig(spec_type="draft-mtp"))
    with pytest.raises(IncompatibleModelError, match="MTP head"):
        Llama(files["plain"], speculative=SpecConfig(spec_type="draft-mtp"), verbose=False)
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "generate", "--model", files["plain"],
                        "--spec-type", "draft-mtp", "--prompt", PROMPT, "--max-tokens", "8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "MTP head" in r.stderr


def test_generate_cli_and_bench_with_the_mtp_head(files, tmp_path):
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "generate", "--model", files["target"],
                        "--spec-type", "draft-mtp", "--draft-tokens", "4", "--prompt", PROMPT, "--max-tokens", "32"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "draft-mtp" in r.stderr and "accepted" in r.stderr
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "bench", "--model", files["target"], "--spec-type",
                        "draft-mtp", "--draft-tokens", "4", "--max-tokens", "32", "--runs", "1", "--warmup-tokens", "4",
                        "--raw-prompt", "--prompt", PROMPT, "--json", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["comparison"]["output_tokens_match"]
    assert data["speculative"]["stats"]["accepted"] > 0


def test_serve_with_the_mtp_head_and_its_refusal_in_a_batch(files):
    from fastapi.testclient import TestClient

    from llama_dflash.server.app import create_app

    kw = dict(n_ctx=512, n_batch=64, n_threads=2, verbose=False, flash_attn=True)
    body = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0}
    answers = {}
    for name, spec in (("plain", None), ("mtp", SpecConfig(spec_type="draft-mtp", draft_n_max=4))):
        llm = Llama(files["target"], speculative=spec, **kw)
        with TestClient(create_app(llm)) as client:
            r = client.post("/v1/completions", json=body)
        llm.close()
        assert r.status_code == 200, r.text
        answers[name] = r.json()
    assert answers["mtp"]["choices"][0]["text"] == answers["plain"]["choices"][0]["text"]
    assert answers["mtp"]["timings"]["draft_n"] > 0 and answers["mtp"]["timings"]["draft_n_accepted"] > 0
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "serve", "--model", files["target"], "--spec-type",
                        "draft-mtp", "--parallel", "2", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--parallel 1" in r.stderr
