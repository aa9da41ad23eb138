"""llama.cpp's own HF -> GGUF converter, from the llama-cpp-python 0.3.36 sdist, for round-trip tests.

The sdist vendors llama.cpp with `convert_hf_to_gguf.py`, its `conversion/` package and `gguf-py/`.
It is found in $LLAMA_DFLASH_LCP_SDIST (an untarred sdist), else in a cache directory, else
downloaded there with pip (its cache makes that quick); tests skip with the reason when none works.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

VERSION = "0.3.36"
_SCRIPT = Path("vendor/llama.cpp/convert_hf_to_gguf.py")
_MODULES = ("torch", "transformers", "safetensors", "sentencepiece", "google.protobuf")


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llama-dflash" / "lcp-sdist"


def find_converter() -> Path:
    """Path of convert_hf_to_gguf.py; raises RuntimeError saying why it cannot be had."""
    import importlib.util

    missing = [m for m in _MODULES if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        raise RuntimeError(f"the converter needs {', '.join(missing)} (pip install 'llama-dflash[convert]')")
    roots = [Path(os.environ["LLAMA_DFLASH_LCP_SDIST"])] if os.environ.get("LLAMA_DFLASH_LCP_SDIST") else []
    cache = _cache()
    roots.append(cache / f"llama_cpp_python-{VERSION}")
    for root in roots:
        if (root / _SCRIPT).is_file():
            return root / _SCRIPT
    cache.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", str(cache)], capture_output=True, text=True)
    tars = sorted(cache.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if r.returncode or not tars:
        raise RuntimeError(f"cannot download the llama-cpp-python {VERSION} sdist: {r.stderr.strip()[-300:]}")
    with tarfile.open(tars[0]) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name and
                   ("/conversion/" in m.name or "/gguf-py/" in m.name or m.name.endswith(str(_SCRIPT)))]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Pythons before 3.10.12
        tar.extractall(cache, members=members, **safe)
    if not (roots[-1] / _SCRIPT).is_file():
        raise RuntimeError(f"{tars[0]} holds no {_SCRIPT}")
    return roots[-1] / _SCRIPT


def convert(converter: Path, hf_dir: str, target_dir: str, out: str) -> str:
    """Run the converter on `hf_dir` (vocabulary from `target_dir`) into `out` (float32)."""
    r = subprocess.run([sys.executable, str(converter), hf_dir, "--target-model-dir", target_dir,
                        "--outtype", "f32", "--outfile", out], capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise AssertionError(f"convert_hf_to_gguf.py failed:\n{r.stderr[-3000:]}")
    return out


@pytest.fixture(scope="session")
def hf_converter() -> Path:
    try:
        return find_converter()
    except RuntimeError as e:
        pytest.skip(str(e))
