"""Data-parallel training with torch.distributed: 2 CPU processes (gloo) train one shared model."""

import json
import os
import socket
import subprocess
import sys

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_train_one_model(cycle_target, tmp_path):
    pytest.importorskip("torch.distributed.run")
    prompts = tmp_path / "p.txt"
    letters = "abcdefghijklmnopqrstuvwxyz"
    prompts.write_text("\n".join(" ".join(letters[(i + k) % 26] for k in range(3)) for i in range(26)) + "\n")
    out = tmp_path / "draft.gguf"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                        "-m", "llama_dflash.train",
                        "--model", cycle_target, "--output", str(out), "--prompts", str(prompts), "--n-prompts", "24",
                        "--eval-prompts", "2", "--max-new-tokens", "24", "--block-size", "4", "--steps", "40",
                        "--batch-size", "2", "--anchors-per-seq", "4", "--lr", "1e-2", "--threads", "1",
                        "--device", "cpu", "--workdir", str(tmp_path / "w"), "--no-progress", "--skip-eval"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)  # only rank 0 reports
    tr = rep["train"]
    assert tr["world_size"] == 2 and tr["device"] == "cpu"
    a, b = tr["rank_checksums"]
    assert a == b  # the same weights on both ranks
    assert tr["loss_end"] < 0.5 * tr["loss_start"]
    assert out.is_file()


def test_device_choice(tiny_target, tmp_path):
    import torch

    from llama_dflash.train.device import resolve_device

    assert resolve_device("cpu").type == "cpu"
    if torch.cuda.is_available():
        assert resolve_device("auto").type == "cuda"
    elif not torch.backends.mps.is_available():
        assert resolve_device("auto").type == "cpu"
    with pytest.raises(ValueError, match="--device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda")
        r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", "--model", tiny_target, "--output",
                            str(tmp_path / "o.gguf"), "--device", "cuda", "--no-progress"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "CUDA" in r.stderr and "Traceback" not in r.stderr
