"""Acceptance of a draft measured by llama.cpp's own C++ driver, `llama-speculative-simple`.

Why here: the training half of issue 44 must measure EAGLE-3 and draft-simple files before (and
independently of) the engine's own proposers for them, and the C++ driver is the reference those
proposers are checked against. Any draft the driver runs can be measured the same way (DSpark and
DFlash too), so a table of several drafts comes from one tool, one prompt set, one setting.

The driver prints one `accepted A/D draft tokens` debug line per verification step (`-lv 5`);
from them: tau (tokens per step, the target's own included), and per draft position the share of
the steps that proposed a token there in which it was accepted (the engine's
`SpecStats.acceptance_per_position`). It is found through $LLAMA_SPECULATIVE_SIMPLE or in
~/.cache/llama-cpp-reference/build/bin (bench/build_cpp_reference.sh builds it there).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

__all__ = ["find_driver", "driver_spec_type", "driver_run", "driver_acceptance", "special_text"]


def find_driver() -> Optional[str]:
    """Path of llama-speculative-simple, or None when it is not built."""
    path = os.environ.get("LLAMA_SPECULATIVE_SIMPLE") or os.path.join(
        os.path.expanduser("~"), ".cache", "llama-cpp-reference", "build", "bin", "llama-speculative-simple")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def driver_spec_type(draft_path: str) -> str:
    """The driver's --spec-type for a draft file, from its architecture."""
    from ..bench.cpp_reference import cpp_spec_type
    from ..inspect import read_gguf

    arch = read_gguf(draft_path).architecture
    if arch == "eagle3":
        return "draft-eagle3"
    if arch == "dflash":
        return cpp_spec_type(draft_path)
    return "draft-simple"


def special_text(model_path: str, tokens: Sequence[int]) -> str:
    """Text of tokens with special tokens written out (the driver parses them back)."""
    import ctypes

    from llama_cpp import llama_cpp as ll

    from .._llama import Model, set_verbose

    set_verbose(False)
    m = Model(model_path, n_gpu_layers=0)
    try:
        out = bytearray()
        buf = ctypes.create_string_buffer(512)
        for t in tokens:
            n = ll.llama_token_to_piece(m.vocab, int(t), buf, len(buf), 0, True)
            if n > 0:
                out += buf.raw[:n]
        return out.decode("utf-8", errors="replace")
    finally:
        m.close()


def driver_run(target: str, draft: str, prompt: str, *, n_predict: int, n_max: int, threads: Optional[int] = None,
               n_ctx: int = 2048, spec_type: Optional[str] = None, ignore_eos: bool = False,
               binary: Optional[str] = None, timeout: float = 600):
    """One greedy run of the C++ driver (`bench.cpp_reference.CppResult`, its `steps` read from the
    debug log): `draft` at `n_max` draft tokens, p_min 0, n_min 0; the prompt text as it is."""
    from .._llama import cpu_has_amx
    from ..bench.cpp_reference import parse_cpp_output, run_driver

    binary = binary or find_driver()
    if binary is None:
        raise FileNotFoundError("llama-speculative-simple is not built (bench/build_cpp_reference.sh, or set "
                                "LLAMA_SPECULATIVE_SIMPLE)")
    cmd = [binary, "-m", target, "-md", draft, "--spec-type", spec_type or driver_spec_type(draft), "-p", prompt,
           "-n", str(n_predict), "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0", "-c", str(n_ctx), "--temp", "0", "--top-k", "1", "--repeat-penalty", "1",
           "-ngl", "99", "-ngld", "99", "-lv", "5"]
    if threads:
        cmd += ["-t", str(threads), "-td", str(threads)]
    if ignore_eos:
        cmd.append("--ignore-eos")
    if cpu_has_amx():
        cmd.append("--no-repack")
    return run_driver(cmd, parse_cpp_output, timeout=timeout)


def driver_acceptance(target: str, draft: str, prompts: Sequence[str], *, n_predict: int, n_max: int,
                      threads: Optional[int] = None, n_ctx: int = 2048, spec_type: Optional[str] = None,
                      ignore_eos: bool = False, binary: Optional[str] = None, timeout: float = 600) -> dict:
    """Greedy speculative decoding of each prompt (text passed as it is: chat-format it first) by
    the C++ driver with `draft` at `n_max` draft tokens (p_min 0, n_min 0); acceptance summed over
    the prompts."""
    spec_type = spec_type or driver_spec_type(draft)
    steps: list[tuple[int, int]] = []
    drafted = accepted = decoded = 0
    seconds = 0.0
    for prompt in prompts:
        res = driver_run(target, draft, prompt, n_predict=n_predict, n_max=n_max, threads=threads, n_ctx=n_ctx,
                         spec_type=spec_type, ignore_eos=ignore_eos, binary=binary, timeout=timeout)
        steps += res.steps
        drafted += res.n_drafted
        accepted += res.n_accept
        decoded += res.decoded_tokens
        seconds += res.seconds
    n_pos = max([d for _, d in steps], default=0)
    proposed = [sum(1 for _, d in steps if d > i) for i in range(n_pos)]
    hits = [sum(1 for a, d in steps if d > i and a > i) for i in range(n_pos)]
    n_steps = len(steps)
    acc_steps = sum(a for a, _ in steps)
    return {"spec_type": spec_type, "n_max": n_max, "prompts": len(prompts), "steps": n_steps,
            "drafted": drafted, "accepted": accepted, "decoded_tokens": decoded,
            "acceptance_per_position": [round(h / p, 4) if p else 0.0 for h, p in zip(hits, proposed)],
            "accepted_per_step": round(acc_steps / n_steps, 4) if n_steps else 0.0,
            "tau": round(1.0 + acc_steps / n_steps, 4) if n_steps else 0.0,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "tokens_per_second": round(decoded / seconds, 2) if seconds else 0.0}
