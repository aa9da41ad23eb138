"""Run llama.cpp's own C++ driver (`llama-speculative-simple`) on the same pair and settings.

Build it with ../shared/tools/build-cpp-reference.sh (same llama.cpp sources as our dependency).

The driver's counts come from its log, and that log is asynchronous: `common/log.cpp` queues each
line for a worker thread, has no synchronous mode, and its logger is deliberately never flushed or
joined at exit, so lines still queued when `main` returns are lost.  Every run of the driver goes
through `run_driver`, which (1) writes its output to a file, not a pipe -- a worker blocked on a
full pipe falls behind and loses the summary at exit, seen every time with -lv 4 through a pipe --
and (2) runs it again, up to `ATTEMPTS` times, while the lines the caller needs are missing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, TypeVar

__all__ = ["BudgetCounts", "CppResult", "CPP_SPEC_TYPES", "IncompleteOutput", "parse_cpp_output",
           "run_cpp_reference", "run_driver", "ATTEMPTS"]

#: runs of the driver before its output is declared incomplete for good
ATTEMPTS = 5
T = TypeVar("T")


class IncompleteOutput(ValueError):
    """The driver exited 0 but its output lacks lines it always prints (its log lost its tail)."""

#: the types llama-speculative-simple chains with --spec-type (llama.cpp 0.3.36's names)
CPP_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
                  "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
#: types that draft with the target's own weights: no draft file (-md)
_NO_FILE_TYPES = ("draft-mtp",)


@dataclass
class CppResult:
    decoded_tokens: int
    seconds: float
    tokens_per_second: float
    n_drafted: int
    n_accept: int
    #: (accepted, drafted) of every verification step, from the driver's debug log (empty without it)
    steps: list[tuple[int, int]] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.n_accept / self.n_drafted if self.n_drafted else 0.0

    def within_budget(self, n_predict: int) -> "BudgetCounts":
        """The driver's counts over the steps ours also takes with a budget of n_predict tokens.

        The driver caps each draft at `n_predict - n - 1` (n: tokens so far), as we do, but two
        things differ at the end: it runs until it has MORE than n_predict tokens (one step past
        the budget), and a cap of 0 reaches llama.cpp's speculative layer as "no limit"
        (common/speculative.cpp truncates only when n_max > 0), so the step at n_predict - 1 drafts
        a full block where ours decodes one plain token.  Those steps are left out here."""
        accepted = drafted = excluded = excluded_drafted = 0
        n = 0
        for a, d in self.steps:
            if n >= n_predict or (d > 0 and n_predict - n - 1 <= 0):
                excluded += 1
                excluded_drafted += d
            else:
                accepted += a
                drafted += d
            n += a + 1
        return BudgetCounts(accepted, drafted, excluded, excluded_drafted)


@dataclass(frozen=True)
class BudgetCounts:
    accepted: int
    drafted: int
    excluded_steps: int  # steps past the budget, or whose cap of 0 llama.cpp read as no cap
    excluded_drafted: int


_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+)\s+t/s")
_FIELD = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")
_STEP = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def parse_cpp_output(text: str) -> CppResult:
    """Parse the summary llama-speculative-simple prints at the end of a run; IncompleteOutput if
    a line of it is missing (a summary cut after its 'decoded' line must not read as 0 drafted)."""
    m = _DECODED.search(text)
    if not m:
        raise IncompleteOutput("llama-speculative-simple output has no 'decoded N tokens in S seconds' line")
    fields = dict((k, int(v)) for k, v in _FIELD.findall(text))
    missing = [k for k in ("n_drafted", "n_accept") if k not in fields]
    if missing:
        raise IncompleteOutput(f"llama-speculative-simple output has no '{missing[0]} = N' line after its "
                               "'decoded' line")
    steps = [(int(a), int(d)) for a, d in _STEP.findall(text)]
    return CppResult(int(m.group(1)), float(m.group(2)), float(m.group(3)),
                     fields["n_drafted"], fields["n_accept"], steps)


def run_driver(cmd: Sequence[str], parse: Callable[[str], T], *, timeout: float = 1800,
               attempts: int = ATTEMPTS) -> T:
    """Run a llama.cpp driver command and `parse` its output (stdout and stderr, in a file).

    A non-zero exit is a ValueError with the last lines; `parse` raising IncompleteOutput runs the
    command again (see the module's docstring), up to `attempts` runs in all."""
    for attempt in range(1, attempts + 1):
        # the driver echoes generated text: a tiny random model's bytes need not be UTF-8
        with tempfile.TemporaryFile() as out:
            proc = subprocess.run(list(cmd), stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
            out.seek(0)
            text = out.read().decode("utf-8", errors="replace")
        if proc.returncode != 0:
            tail = text.strip().splitlines()[-3:]
            raise ValueError(f"{os.path.basename(cmd[0])} failed (exit {proc.returncode}): {' | '.join(tail)}")
        try:
            return parse(text)
        except IncompleteOutput as e:
            if attempt == attempts:
                raise IncompleteOutput(f"{e} (in {attempts} runs: its asynchronous log loses its last "
                                       "lines at exit)") from None
            print(f"{os.path.basename(cmd[0])}: {e}; running it again ({attempt + 1}/{attempts})",
                  file=sys.stderr)
    raise AssertionError("unreachable")


def cpp_spec_type(draft: str) -> str:
    """The C++ driver's --spec-type for a draft file: an eagle3 file is `draft-eagle3`, a dflash
    file `draft-dspark` with a Markov head (anchor-first blocks) else `draft-dflash`, any other
    model `draft-simple`; an unreadable file is left for the driver to refuse."""
    from ..inspect import detect_algorithm, read_gguf

    try:
        info = read_gguf(draft)
    except (OSError, ValueError):
        return "draft-dflash"
    if info.architecture == "eagle3":
        return "draft-eagle3"
    if info.architecture != "dflash":
        return "draft-simple"
    return "draft-dspark" if detect_algorithm(info) == "dspark" else "draft-dflash"


def run_cpp_reference(binary: str, model: str, draft: Optional[str], prompt: str, *, n_predict: int,
                      draft_n_max: int, draft_p_min: float, n_ctx: int, n_batch: int, n_ubatch: int,
                      threads: Optional[int], repack: bool, ignore_eos: bool = False,
                      spec_types: Optional[Sequence[str]] = None, extra_args: Sequence[str] = (),
                      timeout: float = 1800, timed: bool = True) -> CppResult:
    """Run the C++ driver greedily on the same prompt text (passed raw: it tokenizes it itself, so
    pass the chat-formatted text), n_predict, draft settings, threads and ignore-eos.

    `spec_types`: llama.cpp's speculative types to chain (default: the draft's own type); a draft
    type among them needs `draft`.  `extra_args`: more flags, e.g. `ngram.cpp_ngram_args(...)`.
    It runs twice: once with its debug log for the per-step counts (`CppResult.steps`), once
    without it for the timing (the log costs the driver ~6% of its speed); `timed=False` skips
    the second run (counts only: its speed is then the logged run's)."""
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise ValueError(f"--cpp-reference {binary}: not an executable file")
    types = list(spec_types) if spec_types else [cpp_spec_type(draft) if draft else ""]
    bad = [t for t in types if t not in CPP_SPEC_TYPES]
    if bad:
        raise ValueError(f"llama-speculative-simple has no speculative type {bad[0]!r} "
                         f"(it has {', '.join(CPP_SPEC_TYPES)})")
    uses_draft = any(t.startswith("draft-") and t not in _NO_FILE_TYPES for t in types)
    if uses_draft and not draft:
        raise ValueError(f"--spec-type {','.join(types)} needs a draft model")
    cmd = [binary, "-m", model]
    if uses_draft:
        cmd += ["-md", draft]
    cmd += ["--spec-type", ",".join(types), "-p", prompt,
            "-n", str(n_predict), "--spec-draft-n-max", str(draft_n_max), "--spec-draft-n-min", "0",
            "--spec-draft-p-min", str(draft_p_min), "-c", str(n_ctx), "-b", str(n_batch), "-ub", str(n_ubatch),
            "--temp", "0", "--top-k", "1", "--repeat-penalty", "1", "-ngl", "99", *extra_args]
    if uses_draft:
        cmd += ["-ngld", "99"]
    if threads:
        cmd += ["-t", str(threads)] + (["-td", str(threads)] if uses_draft else [])
    if ignore_eos:
        cmd.append("--ignore-eos")
    if not repack:
        cmd.append("--no-repack")
    counted = _run_binary(cmd + ["-lv", "5"], timeout)
    if not timed:
        return counted
    result = _run_binary(cmd, timeout)
    result.steps = counted.steps
    return result


def _run_binary(cmd: list[str], timeout: float) -> CppResult:
    return run_driver(cmd, parse_cpp_output, timeout=timeout)
