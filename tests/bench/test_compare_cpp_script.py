"""`bench/compare_cpp.py --micro DIR`: the microscopic random pair that shows host overhead per step
(issue 28 item 5), written by the script itself so the measurement is one command."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_dflash import LlamaDFlashDecoding, SpecConfig, TargetConfig

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "compare_cpp.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("bench_compare_cpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_micro_pair_is_written_once_and_drafts(compare, tmp_path):
    target, draft = compare.write_micro_pair(str(tmp_path / "micro"))
    stamps = os.stat(target).st_mtime_ns, os.stat(draft).st_mtime_ns
    assert compare.write_micro_pair(str(tmp_path / "micro")) == (target, draft)
    assert (os.stat(target).st_mtime_ns, os.stat(draft).st_mtime_ns) == stamps  # kept, not rewritten
    cfg = TargetConfig(target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with LlamaDFlashDecoding(cfg, SpecConfig(draft, draft_n_max=4)) as engine:
        assert engine.target.n_embd == 64
        res = engine.generate([1, 2, 3], 24, ignore_eos=True)
    assert len(res.tokens) == 24
    assert res.stats.drafted > 0  # a random draft is proposed (and verified) at every step


def test_micro_with_a_model_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--bin", str(tmp_path), "--micro", str(tmp_path / "m"),
                           "--model", "x.gguf"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--micro writes its own pair" in proc.stderr
    assert not (tmp_path / "m").exists()
