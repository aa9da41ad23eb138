"""bench/gpu_kit.py loaded as a module (bench/ is no package), and the kit made once per test
session for the kit's tests and the plan's CPU rehearsal (shared through this module: a
conftest.py here would shadow tests/conftest.py, which other tests import by name)."""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_KITS: dict[str, tuple[Path, dict]] = {}
#: why a kit could not be made here (the package index unreachable): later asks skip at once
_SKIPS: dict[str, str] = {}


def load_gpu_kit():
    if "gpu_kit" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_kit", ROOT / "bench" / "gpu_kit.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gpu_kit"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["gpu_kit"]


def _index_reachable(tmp: str) -> bool:
    """Whether pip can download from the package index (a tiny pure-Python wheel)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir",
                               "--timeout", "15", "--retries", "0", "-d", tmp, "six"],
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def kit_for(python: str) -> tuple[Path, dict]:
    """(kit folder, manifest) of a kit for CPython `python`, made once per session; skips the
    test where making it fails because the package index cannot be reached."""
    if python in _SKIPS:
        pytest.skip(_SKIPS[python])
    if python not in _KITS:
        kit = load_gpu_kit()
        base = tempfile.mkdtemp(prefix=f"gpu-kit-{python}-")
        atexit.register(shutil.rmtree, base, True)
        out = Path(base) / "gpu-kit"
        # first a quick, bounded probe: where the network drops packets, pip's own retries and
        # timeouts would take minutes before the kit's first download gave up
        if not _index_reachable(base):
            _SKIPS[python] = "making the GPU kit needs the package index (pip download), unreachable here"
            pytest.skip(_SKIPS[python])
        _KITS[python] = out, kit.make_kit(out, python=python, log=lambda _msg: None)
    return _KITS[python]


def host_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"
