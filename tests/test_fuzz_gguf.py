"""Fuzzed GGUF targets and drafts through `llama-dflash bench`: never a signal, always one line.

Every file of the corpus (tests/fuzz/gguf_mutations.py, seeded) goes through the CLI's `main` in
its own process, 2 at a time, with an address-space limit: no SIGABRT/SIGSEGV/SIGBUS, each done
within 2 s, and each refused file ends with exit code 2 and exactly one stderr line naming the
file and the field.  Bit flips may leave a file valid (then it loads and runs 2 tokens, and must
exit 0 or refuse it the same way).

The corpus runs in processes forked from a fork server (tests/fuzz/forkserver.py), a fresh
interpreter that has imported the CLI's modules and never touched llama.cpp's backend: this
pytest process may have initialised CUDA (tests/_equivalence.py asks llama.cpp for its devices),
and a child forked from it could not use the GPU.  A fresh interpreter per file would cost ~1-2 s
each on this 2-core machine (mostly importing FastAPI for the `serve` subcommand's parser), which
would make 400+ files take minutes.  The fork server sees no GPU (CUDA_VISIBLE_DEVICES and
HIP_VISIBLE_DEVICES empty): on a GPU build each child would otherwise initialise the device within
its 2 s, and reading a malformed file is the same on any device.  `test_cli_subprocess_sample` runs
one file of every family and role through a real `python -m llama_dflash.cli bench` with the
build's devices visible (its memory limit set in the child's interpreter, not in a preexec hook of
this process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from fuzz.gguf_mutations import Case, corpus
from llama_dflash.writer import write_random_draft

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forks children and reads /proc/self/status")

NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
FORK_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz", "forkserver.py")

TIME_LIMIT_S = 2.0
EXTRA_MEMORY = 1 << 30  # bytes of address space a child may add to what it inherited
ARGS = ["--max-tokens", "2", "--runs", "1", "--warmup-tokens", "0", "--n-ctx", "64", "--n-batch", "32",
        "--n-ubatch", "32", "--prompt", "a b", "--threads", "1", "--quiet"]


@dataclass
class Outcome:
    case: Case
    path: str
    code: int | None  # exit code, None if killed by a signal
    sig: int | None
    stderr: str
    seconds: float


@pytest.fixture(scope="module")
def fixtures(tiny_dir, tiny_target, tiny_draft):
    return {
        "target": tiny_target,
        "draft": tiny_draft,
        "d2t": write_random_draft(str(tiny_dir / "fuzz_d2t.gguf"), tiny_target, seed=21, draft_vocab=48),
        "dspark": write_random_draft(str(tiny_dir / "fuzz_dspark.gguf"), tiny_target, seed=22, markov_rank=8,
                                     confidence_head=True),
    }


@pytest.fixture(scope="module")
def cases(fixtures, tmp_path_factory):
    return corpus(fixtures, str(tmp_path_factory.mktemp("fuzz_src")))


def _argv(case: Case, path: str, fixtures: dict[str, str]) -> list[str]:
    target, draft = (path, fixtures["draft"]) if case.role == "target" else (fixtures["target"], path)
    return ["bench", "--model", target, "--draft-model", draft, *ARGS]


def run_forked(items: list[tuple[Case, str, list[str]]], workdir: str, parallel: int = 2) -> list[Outcome]:
    """Each (case, path, argv) in a child of the fork server, `parallel` at a time; children past
    5x the time limit are killed (reported as a signal)."""
    errs = {case.name: os.path.join(workdir, case.name.replace("/", "_") + ".err") for case, _, _ in items}
    jobs = "".join(json.dumps({"name": case.name, "argv": argv, "err": errs[case.name]}) + "\n"
                   for case, _, argv in items)
    proc = subprocess.run([sys.executable, FORK_SERVER, "--parallel", str(parallel), "--time-limit",
                           str(TIME_LIMIT_S), "--extra-memory", str(EXTRA_MEMORY)],
                          input=jobs, capture_output=True, text=True, timeout=60 + 10 * TIME_LIMIT_S * len(items),
                          env={**os.environ, **NO_GPU})
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    assert proc.returncode == 0 and lines and lines[0].get("ready"), (proc.returncode, proc.stderr[-2000:])
    assert lines[0]["backend_initialised"] is False  # the children start with no backend state
    by_name = {case.name: (case, path) for case, path, _ in items}
    assert len(by_name) == len(items), "case names must be unique"
    done = []
    for r in lines[1:]:
        case, path = by_name[r["name"]]
        with open(errs[case.name], encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        done.append(Outcome(case, path, r["code"], r["sig"], text, r["seconds"]))
    return done


def problems(o: Outcome) -> list[str]:
    """What is wrong with one outcome (empty: fine)."""
    lines = [x for x in o.stderr.splitlines() if x.strip()]
    out = []
    if o.sig is not None:
        out.append(f"killed by signal {signal.Signals(o.sig).name}")
    if o.seconds > TIME_LIMIT_S:
        out.append(f"took {o.seconds:.2f} s")
    if o.case.may_load and o.code == 0:
        return out
    if o.code != 2:
        out.append(f"exit code {o.code}")
    if len(lines) != 1:
        out.append(f"{len(lines)} stderr lines")
    elif os.path.basename(o.path) not in lines[0]:
        out.append("the file is not named")
    elif o.case.fields is not None and not any(f in lines[0] for f in o.case.fields):
        out.append(f"none of {o.case.fields} named")
    return out


def _write(cases: list[Case], workdir: str) -> list[tuple[Case, str]]:
    out = []
    for c in cases:
        path = os.path.join(workdir, c.name.replace("/", "_") + ".gguf")
        with open(path, "wb") as fh:
            fh.write(c.data)
        out.append((c, path))
    return out


def _report(outcomes: list[Outcome]) -> str:
    bad = [(o, p) for o in outcomes if (p := problems(o))]
    kinds = Counter(x if x.startswith("killed") else x.split(" ", 1)[1] if x[0].isdigit() else x.split(" ")[0]
                    for _, p in bad for x in p)
    lines = [f"{len(bad)} of {len(outcomes)} cases failed ({dict(kinds)}):"]
    for o, p in bad[:40]:
        lines.append(f"  {o.case.name}: {'; '.join(p)} | {o.stderr.strip()[-300:]!r}")
    return "\n".join(lines)


def test_corpus_is_large_and_deterministic(cases, fixtures, tmp_path):
    assert len(cases) >= 300
    kinds = Counter(c.name.split("-")[1] for c in cases)
    assert {"trunc", "flip", "key", "count", "struct", "sem"} <= set(kinds)
    again = corpus(fixtures, str(tmp_path))
    assert [(c.name, c.data) for c in again] == [(c.name, c.data) for c in cases]


def test_fuzz_corpus_through_cli(cases, fixtures, tmp_path):
    written = _write(cases, str(tmp_path))
    outcomes = run_forked([(c, p, _argv(c, p, fixtures)) for c, p in written], str(tmp_path))
    assert len(outcomes) == len(cases)
    assert not any(problems(o) for o in outcomes), _report(outcomes)
    slowest = max(outcomes, key=lambda o: o.seconds)
    print(f"{len(outcomes)} files, {sum(o.code == 0 for o in outcomes)} loaded, slowest {slowest.case.name} "
          f"{slowest.seconds:.2f} s")
    loaded = [o.case.name for o in outcomes if o.code == 0]
    assert all(o.case.may_load for o in outcomes if o.code == 0), loaded


#: the CLI in a fresh interpreter that limits its own address space first (no preexec hook: a
#: Python callback between fork and exec is unsafe in a process with threads, as CUDA's are)
LIMITED_CLI = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
               "sys.argv = ['llama-dflash', *sys.argv[1:]]; runpy.run_module('llama_dflash.cli', run_name='__main__')")


def test_cli_subprocess_sample(cases, fixtures, tmp_path):
    """One case of every family and role through a real `python -m llama_dflash.cli bench`."""
    sample, seen = [], set()
    for c in cases:
        key = (c.role, c.name.split("-")[1], c.may_load)
        if key not in seen:
            seen.add(key)
            sample.append(c)
    failures = []
    for c, path in _write(sample, str(tmp_path)):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", LIMITED_CLI, *_argv(c, path, fixtures)],
                              capture_output=True, text=True, timeout=120)
        secs = time.perf_counter() - t0
        sig = -proc.returncode if proc.returncode < 0 else None
        o = Outcome(c, path, None if sig else proc.returncode, sig, proc.stderr, 0.0)
        p = problems(o)
        if p:
            failures.append(f"{c.name}: {'; '.join(p)} ({secs:.1f} s) {proc.stderr.strip()[-300:]!r}")
    assert not failures, "\n".join(failures)
