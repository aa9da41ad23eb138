"""bench/gpu_train.sh end to end on the CPU with a tiny target: capped data with the PyTorch
backend, two draft shapes trained side by side on it, each exported, logs and reports packed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_train_script_on_cpu(tmp_path):
    pytest.importorskip("torch")
    from llama_dflash.writer import write_tiny_target

    target = write_tiny_target(str(tmp_path / "tiny.gguf"), n_embd=64, n_layer=4)
    out = tmp_path / "out"
    env = {**os.environ, "GPU_TRAIN_PYTHON": sys.executable, "GPU_TRAIN_MODEL": target, "GPU_TRAIN_DEVICE": "cpu",
           "GPU_TRAIN_WORK": str(tmp_path / "work"), "GPU_TRAIN_DATA_SECONDS": "20", "GPU_TRAIN_TOKENS": "4000",
           "GPU_TRAIN_VARIANTS": "1:64 2:32", "GPU_TRAIN_NSEQ": "64"}
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_train.sh"), str(out), "170"], env=env,
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "training 2 variants side by side" in r.stdout
    for name in ("L1-V64", "L2-V32"):
        assert (out / f"{name}.q4_0.gguf").stat().st_size > 0
    with tarfile.open(out / "logs.tar.gz") as t:
        names = t.getnames()
        rep = json.load(t.extractfile("logs/L2-V32.report.json"))
    assert "logs/data.log" in names
    assert rep["draft_layers"] == 2 and rep["reduced_vocab"] == 32 and rep["data"] == "mix"
    assert rep["train_answer_tokens"] > 0 and rep["parity"]["agreement"] >= 0.9
