"""The CPU REHEARSAL of the device plan (bench/gpu_plan/): the same three scripts, in order, on
the kit as `make gpu-kit` makes it (for this interpreter), against an emulation of the GPU
machine's Python environment (device_site.py: only the packages the device image has), so that
the first lent GPU does not find the plan's bugs.

What differs from the device, and only that: GPU_PLAN_BUILD=reuse (no compile here: the trimmed
source is configured, for CUDA sm_90 where this machine has nvcc, and the installed CPU
libraries are used), tiny shapes, 16-token runs, one small test file instead of `-m gpu`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_kit_helpers import ROOT, host_python, kit_for

PLAN = ROOT / "bench" / "gpu_plan"
CPP_BIN = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama-cpp-reference" / "build" / "bin"
OUT_FILES_MAX, OUT_FILE_BYTES_MAX = 8, 16 << 20  # what comes back from a device call


def _fake_cuda_libs(root: Path) -> dict[str, str]:
    """Where nvcc has no cuBLAS and no driver library (as here), stand-ins for what the device's
    PyTorch packages and driver provide, so that the CUDA configure runs (nothing links them)."""
    inc, lib, drv = root / "nvidia" / "cu13" / "include", root / "nvidia" / "cu13" / "lib", root / "driver"
    for d in (inc, lib, drv):
        d.mkdir(parents=True)
    (inc / "cublas_v2.h").write_text("")
    src = root / "empty.c"
    src.write_text("int llama_dflash_stand_in;\n")
    for out in (lib / "libcublas.so.13", lib / "libcublasLt.so.13", drv / "libcuda.so.1"):
        subprocess.run(["gcc", "-shared", "-o", str(out), str(src)], check=True)
    return {"site": str(root), "driver": str(drv)}


def _out_files(out: Path) -> dict[str, int]:
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    assert len(files) <= OUT_FILES_MAX, files
    assert all(n <= OUT_FILE_BYTES_MAX for n in files.values()), files
    assert not [p for p in out.iterdir() if p.is_dir()]
    return files


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    kit_dir, manifest = kit_for(host_python())
    work = tmp_path_factory.mktemp("rehearsal")
    site = work / "device-site"
    subprocess.run([sys.executable, str(PLAN / "device_site.py"), str(site)], check=True, capture_output=True)
    import llama_cpp

    env = {**os.environ, "GPU_PLAN_KIT": str(kit_dir), "GPU_PLAN_STATE": str(work / "state"),
           "GPU_PLAN_PYTHON": sys.executable, "GPU_PLAN_SITE": str(site), "GPU_PLAN_BUILD": "reuse",
           "GPU_PLAN_REUSE_LIBS": os.path.join(os.path.dirname(llama_cpp.__file__), "lib"),
           "GPU_PLAN_SHAPES": "tiny small", "GPU_PLAN_SHAPE_TOKENS": "16", "GPU_PLAN_SHAPE_DRAFTS": "1,2",
           "GPU_PLAN_TOKENS": "16", "GPU_PLAN_DRAFTS": "1,2,auto", "GPU_PLAN_TESTS": "tests/bench/test_costmodel.py",
           "GPU_PLAN_BENCH_ARGS": "--threads 1 --warmup-tokens 4", "GPU_PLAN_SECONDS": "240"}
    # one thread: on a shared 2-core machine llama.cpp's spinning worker threads run 5-10x slower
    # under load (a 16-token SmolLM2 sweep: 19 s with --threads 1, cut at 107 s with 2)
    # pip as on the device: no configuration (this machine's points pip at local wheel folders and
    # mirrors, which --no-index would still search), no PIP_* settings
    for key in [k for k in env if k.startswith("PIP_")]:
        del env[key]
    env["PIP_CONFIG_FILE"] = os.devnull
    env.pop("OUT", None)
    cuda = bool(shutil.which("nvcc") and shutil.which("gcc"))
    if cuda:  # configure for CUDA sm_90 exactly as the device does (the default GPU_PLAN_CMAKE_ARGS)
        fake = _fake_cuda_libs(work / "fake-cuda")
        env["GPU_PLAN_SITE"] += ":" + fake["site"]
        env["GPU_PLAN_DRIVER_DIRS"] = fake["driver"]
    else:
        env["GPU_PLAN_CMAKE_ARGS"] = ""
    if (CPP_BIN / "llama-speculative-simple").is_file():
        env["GPU_PLAN_CPP_BIN"] = str(CPP_BIN)
    runs = {}
    for step in ("step1_build", "step2_shapes", "step3_pair"):
        out = work / "out" / step
        out.mkdir(parents=True)
        t0 = time.time()
        proc = subprocess.run(["bash", str(PLAN / f"{step}.sh")], env={**env, "OUT": str(out)}, cwd=work,
                              capture_output=True, text=True, timeout=300)
        runs[step] = (proc, out, time.time() - t0)
    # a step 2 that only gathers its pieces (how a machine gone cold is brought back: README.md)
    out = work / "out" / "step2_skip"
    out.mkdir(parents=True)
    t0 = time.time()
    proc = subprocess.run(["bash", str(PLAN / "step2_shapes.sh")], env={**env, "OUT": str(out), "GPU_PLAN_SHAPES": "skip"},
                          cwd=work, capture_output=True, text=True, timeout=120)
    runs["step2_skip"] = (proc, out, time.time() - t0)
    return {"runs": runs, "env": env, "work": work, "cuda": cuda, "manifest": manifest}


def _ok(rehearsal, step):
    proc, out, seconds = rehearsal["runs"][step]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, out


@pytest.mark.slow
def test_rehearsal_step1_installs_from_the_kit_with_no_index(rehearsal):
    proc, out = _ok(rehearsal, "step1_build")
    assert set(_out_files(out)) >= {"build.json", "plan.log", "configure.log", "install.log"}
    build = json.loads((out / "build.json").read_text())
    assert build["mode"] == "reuse" and build["backend"] == "CPU"
    assert "libllama.so" in build["libraries"]
    args = build["cmake_args"]
    assert "-DLLAMA_BUILD_EXAMPLES=ON" in args and "-G Ninja" in args
    if rehearsal["cuda"]:
        assert "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" in args and "-DCUDA_cublas_LIBRARY=" in args
        assert "Including CUDA backend" in (out / "configure.log").read_text()
    # the no-index install: our package from the tree, llama-cpp-python from the trimmed sdist
    vpy = Path(rehearsal["env"]["GPU_PLAN_STATE"]) / "venv" / "bin" / "python"
    probe = subprocess.run([str(vpy), "-c", "import llama_cpp, llama_dflash, gguf, diskcache, fastapi; "
                            "print(llama_cpp.__version__, llama_dflash.__file__)"], cwd="/",
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    version, where = probe.stdout.split()
    assert version == "0.3.36" and "site-packages" in where  # installed, not the tree's copy


@pytest.mark.slow
def test_rehearsal_step2_measures_the_shaped_targets(rehearsal):
    _, out = _ok(rehearsal, "step2_shapes")
    assert set(_out_files(out)) == {"shapes.json", "shapes.md", "tiny.json", "small.json", "plan.log"}
    summary = json.loads((out / "shapes.json").read_text())
    assert [r["file"] for r in summary["shapes"]] == ["tiny.json", "small.json"]
    for row in summary["shapes"]:
        assert row["shape"]["name"] in ("tiny", "small") and row["backend"] == "CPU"
        assert [c["k"] for c in row["cost_curve"]] == list(range(1, 16))  # the probe, k = 1..15 (block 16)
        assert all(c["verify_over_decode"] > 0 and c["draft_over_decode"] > 0 for c in row["cost_curve"])
        assert set(row["oracle_decode_speedup"]) == {"1", "2"}
        assert [p["label"] for p in row["predicted"]][:2] == ["ours, chat", "ours, raw code"]
    assert "| k | verify k+1 rows / decode |" in (out / "shapes.md").read_text()


@pytest.mark.slow
def test_rehearsal_step2_skip_only_gathers(rehearsal):
    proc, out = _ok(rehearsal, "step2_skip")
    assert set(_out_files(out)) == {"plan.log"}
    assert "GPU_PLAN_SHAPES=skip" in proc.stdout and "kit: 3 call folder(s) carried" in proc.stdout


@pytest.mark.slow
def test_rehearsal_step3_runs_the_default_pair_tests_and_report(rehearsal):
    _, out = _ok(rehearsal, "step3_pair")
    files = _out_files(out)
    assert set(files) == {"report.md", "bench.json", "plot.png", "bench.txt", "shapes.json", "tests.log",
                          "build.json", "plan.log"}
    d = json.loads((out / "bench.json").read_text())
    assert os.path.basename(d["model"]) == rehearsal["manifest"]["model"]["file"]  # reassembled from the pieces
    assert d["model"].startswith(rehearsal["env"]["GPU_PLAN_STATE"])
    assert os.path.basename(d["draft_model"]) == "SmolLM2-135M-Instruct.dspark.gguf"
    cell = d["cells"][0]
    assert cell["max_tokens"] == 16 and set(cell["speculative"]) == {"1", "2", "auto"} and set(cell["oracle"]) == {"1", "2"}
    assert all(m["output_tokens_match"] for m in cell["speculative"].values())
    assert "passed" in (out / "tests.log").read_text()
    report = (out / "report.md").read_text()
    assert "## The default pair" in report and "| k | tau | speculative token/s |" in report
    assert "## Random-weight targets in real shapes" in report and "GPU test subset: " in report
    if "GPU_PLAN_CPP_BIN" in rehearsal["env"]:
        assert d["cpp_reference"]["accepted_identical"] is True and "ours / C++" in report
    with open(out / "plot.png", "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_rehearsal_fits_its_budget(rehearsal):
    seconds = {step: round(t) for step, (_, _, t) in rehearsal["runs"].items()}
    assert sum(seconds.values()) < 240, seconds


def test_a_later_step_on_a_cold_machine_says_so(tmp_path):
    env = {**os.environ, "GPU_PLAN_KIT": str(tmp_path / "kit"), "GPU_PLAN_STATE": str(tmp_path / "state"),
           "GPU_PLAN_PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    (tmp_path / "kit" / "call2").mkdir(parents=True)
    (tmp_path / "kit" / "call2" / "manifest.json").write_text(json.dumps(
        {"wheels": [], "llama_cpp_python": {"file": "wheels/x.tar.gz", "sha256": "0"}, "model": {"parts": []}}))
    proc = subprocess.run(["bash", str(PLAN / "step2_shapes.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "the machine went cold since step 1" in proc.stderr and "Run step1_build.sh again" in proc.stderr


def test_step1_without_the_kit_says_what_to_carry(tmp_path):
    env = {**os.environ, "GPU_PLAN_KIT": str(tmp_path / "none"), "GPU_PLAN_STATE": str(tmp_path / "state"),
           "GPU_PLAN_PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    proc = subprocess.run(["bash", str(PLAN / "step1_build.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "carry gpu-kit/call1" in proc.stderr


def test_bad_build_mode_is_refused(tmp_path):
    env = {**os.environ, "GPU_PLAN_STATE": str(tmp_path / "state"), "GPU_PLAN_BUILD": "cpu", "OUT": str(tmp_path / "o")}
    proc = subprocess.run(["bash", str(PLAN / "step1_build.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "GPU_PLAN_BUILD must be cuda or reuse" in proc.stderr


def test_scripts_are_strict_bash():
    for script in ("common.sh", "step1_build.sh", "step2_shapes.sh", "step3_pair.sh"):
        text = (PLAN / script).read_text()
        assert "set -euo pipefail" in text or "source" in text and "common.sh" in text, script
        assert subprocess.run(["bash", "-n", str(PLAN / script)]).returncode == 0


def test_gpu_check_on_an_offline_gpu_machine_points_to_the_plan(tmp_path):
    """bench/gpu_check.sh (make gpu-check) is for online machines: where a CUDA build is needed and
    no package index answers, it names the device plan and stops before building anything."""
    from llama_dflash.bench.backend import backend_info

    if backend_info().name == "CUDA":
        pytest.skip("this build already runs on CUDA: gpu_check.sh builds nothing, so it needs no index")
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    for name, body in (("nvidia-smi", "echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'"), ("nvcc", "echo nvcc")):
        (fakebin / name).write_text(f"#!/bin/sh\n{body}\n")
        (fakebin / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PATH=f"{fakebin}:{os.environ['PATH']}", GPU_CHECK_PYTHON=sys.executable, PIP_CONFIG_FILE=os.devnull,
               PIP_NO_INDEX="1")
    out = tmp_path / "out"
    proc = subprocess.run([str(ROOT / "bench" / "gpu_check.sh"), str(out)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no package index answers" in proc.stderr and "bench/gpu_plan/README.md" in proc.stderr
    assert "make gpu-kit" in proc.stderr
    assert not (out / "build.log").exists()  # nothing was built
