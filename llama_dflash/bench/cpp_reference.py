"""Run llama.cpp's own C++ driver (`llama-speculative-simple`) on the same pair and settings.

Build it with ../shared/tools/build-cpp-reference.sh (same llama.cpp sources as our dependency).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Optional

__all__ = ["CppResult", "parse_cpp_output", "run_cpp_reference"]


@dataclass
class CppResult:
    decoded_tokens: int
    seconds: float
    tokens_per_second: float
    n_drafted: int
    n_accept: int

    @property
    def acceptance_rate(self) -> float:
        return self.n_accept / self.n_drafted if self.n_drafted else 0.0


_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+)\s+t/s")
_FIELD = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")


def parse_cpp_output(text: str) -> CppResult:
    """Parse the summary llama-speculative-simple prints at the end of a run."""
    m = _DECODED.search(text)
    if not m:
        raise ValueError("llama-speculative-simple output has no 'decoded N tokens in S seconds' line")
    fields = dict((k, int(v)) for k, v in _FIELD.findall(text))
    return CppResult(int(m.group(1)), float(m.group(2)), float(m.group(3)),
                     fields.get("n_drafted", 0), fields.get("n_accept", 0))


def run_cpp_reference(binary: str, model: str, draft: str, prompt: str, *, n_predict: int, draft_n_max: int,
                      draft_p_min: float, n_ctx: int, n_batch: int, n_ubatch: int, threads: Optional[int],
                      repack: bool, ignore_eos: bool = False, timeout: float = 1800) -> CppResult:
    """Run the C++ driver greedily on the same prompt text (passed raw: it tokenizes it itself, so
    pass the chat-formatted text), n_predict, draft settings, threads and ignore-eos."""
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise ValueError(f"--cpp-reference {binary}: not an executable file")
    cmd = [binary, "-m", model, "-md", draft, "--spec-type", "draft-dflash", "-p", prompt,
           "-n", str(n_predict), "--spec-draft-n-max", str(draft_n_max), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", str(draft_p_min), "-c", str(n_ctx), "-b", str(n_batch), "-ub", str(n_ubatch),
           "--temp", "0", "--top-k", "1", "--repeat-penalty", "1", "-ngl", "99", "-ngld", "99"]
    if threads:
        cmd += ["-t", str(threads), "-td", str(threads)]
    if ignore_eos:
        cmd.append("--ignore-eos")
    if not repack:
        cmd.append("--no-repack")
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ValueError(f"llama-speculative-simple failed (exit {proc.returncode}): {' | '.join(tail)}")
    return parse_cpp_output(proc.stdout + "\n" + proc.stderr)
