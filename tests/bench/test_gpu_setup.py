"""`make setup GPU=...` and bench/gpu_check.sh: toolkit checks fail fast, the GPU check runs on CPU.

Fake `nvidia-smi`/`nvcc` scripts first on PATH make the outcome the same on machines with and
without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llama_dflash.bench.report import TEMPLATE_FIELDS, parse_report

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _fake_tools(tmp_path: Path, **scripts: str) -> dict[str, str]:
    """An environment whose PATH starts with executables named after `scripts` (body: shell)."""
    d = tmp_path / "fakebin"
    d.mkdir(exist_ok=True)
    for name, body in scripts.items():
        f = d / name.replace("_", "-")
        f.write_text(f"#!/bin/sh\n{body}\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{d}:{os.environ['PATH']}"}


NO_GPU = {"nvidia_smi": "exit 9"}  # a driver tool that finds no GPU
H200 = {"nvidia_smi": "echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'", "nvcc": "echo nvcc"}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_setup_cuda_fails_fast_without_a_gpu(tmp_path):
    env = _fake_tools(tmp_path, nvcc="echo nvcc", **NO_GPU)
    venv = tmp_path / "venv"
    proc = subprocess.run(["make", "-C", str(ROOT), "setup", "GPU=cuda", f"VENV={venv}"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "GPU=cuda found nvcc but no NVIDIA GPU or driver" in proc.stderr
    assert not venv.exists()  # nothing was created or downloaded


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_setup_unknown_backend_is_refused(tmp_path):
    proc = subprocess.run(["make", "-C", str(ROOT), "setup", "GPU=cuda13", f"VENV={tmp_path / 'v'}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "GPU must be one of cuda, metal, vulkan, rocm" in proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_setup_cuda_rebuilds_from_source_bypassing_the_wheel_cache(tmp_path):
    env = _fake_tools(tmp_path, **H200)
    proc = subprocess.run(["make", "-n", "-C", str(ROOT), "setup", "GPU=cuda", f"VENV={tmp_path / 'v'}"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pip = next(line for line in proc.stdout.splitlines() if "CMAKE_ARGS=" in line)
    rest = proc.stdout[proc.stdout.index(pip):]
    for flag in ("--no-cache-dir", "--force-reinstall", "--no-binary llama-cpp-python", "llama-cpp-python==0.3.36"):
        assert flag in rest
    # the GPU build comes before the editable install, which then finds 0.3.36 present
    assert rest.index("--force-reinstall") < rest.index("pip install -q -e")


def _cmake_args(backend: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), "cmake-args", backend], env=env, capture_output=True, text=True, timeout=30)


def test_cmake_args_cuda_for_the_local_gpu(tmp_path):
    proc = _cmake_args("cuda", _fake_tools(tmp_path, **H200))
    assert proc.returncode == 0 and proc.stdout.split() == ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=native"]


def test_cmake_args_cuda_for_another_machine(tmp_path):
    env = {**_fake_tools(tmp_path, nvcc="echo nvcc", **NO_GPU), "CUDA_ARCH": "90"}
    proc = _cmake_args("cuda", env)
    assert proc.returncode == 0 and "-DCMAKE_CUDA_ARCHITECTURES=90" in proc.stdout


def test_cmake_args_cuda_without_nvcc(tmp_path):
    env = _fake_tools(tmp_path, **H200)
    os.remove(tmp_path / "fakebin" / "nvcc")
    env["PATH"] = ":".join(p for p in env["PATH"].split(":")
                           if p and not os.path.exists(os.path.join(p, "nvcc")))
    env.pop("CUDACXX", None)
    proc = _cmake_args("cuda", env)
    assert proc.returncode == 2 and "nvcc is not on PATH" in proc.stderr


@pytest.mark.skipif(shutil.which("glslc") is not None, reason="this machine has the Vulkan SDK")
def test_cmake_args_vulkan_without_the_sdk():
    proc = _cmake_args("vulkan", dict(os.environ))
    assert proc.returncode == 2 and "glslc" in proc.stderr


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS has Metal")
def test_cmake_args_metal_off_macos():
    proc = _cmake_args("metal", dict(os.environ))
    assert proc.returncode == 2 and "needs macOS" in proc.stderr


def test_gpu_check_runs_the_cpu_part_without_a_gpu(tmp_path, tiny_target, tiny_draft):
    out = tmp_path / "out"
    env = {
        **_fake_tools(tmp_path, **NO_GPU),
        "GPU_CHECK_PYTHON": sys.executable,
        "GPU_CHECK_MODEL": tiny_target,
        "GPU_CHECK_DRAFT": tiny_draft,
        "GPU_CHECK_TOKENS": "8,12",
        "GPU_CHECK_DRAFTS": "1,2,auto",
        "GPU_CHECK_RUNS": "1",
        "GPU_CHECK_TESTS": str(ROOT / "tests" / "bench" / "test_costmodel.py"),
        "GPU_CHECK_BENCH_ARGS": "--n-ctx 256 --n-batch 64 --n-ubatch 64 --raw-prompt --warmup-tokens 4 --threads 1",
    }
    proc = subprocess.run([str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "no NVIDIA GPU found (nvidia-smi lists none): running the CPU part only"
    assert "tests: " in proc.stdout and "passed" in (out / "tests.log").read_text()
    for name in ("bench.json", "report.md", "plot.png", "bench.txt", "backend.json"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "backend.json").read_text())["backend"] in ("CPU", "CUDA", "ROCm", "Vulkan", "Metal")
    d = json.loads((out / "bench.json").read_text())
    assert [c["max_tokens"] for c in d["cells"]] == [8, 12]
    for cell in d["cells"]:
        assert set(cell["speculative"]) == {"1", "2", "auto"}
        assert set(cell["oracle"]) == {"1", "2"}  # the oracle ceiling at every fixed length
        assert cell["cost_model"]["predictions"] and cell["phases"]["draft_tokens"]
    sections = parse_report((out / "report.md").read_text())
    assert len(sections) == 2 and all(list(s) == TEMPLATE_FIELDS for s in sections)
    assert "oracle ceiling" in (out / "bench.txt").read_text()
