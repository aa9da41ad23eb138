"""Fuzzed GGUF targets and drafts through `llama-dflash bench`: never a signal, always one line.

Every file of the corpus (tests/fuzz/gguf_mutations.py, seeded) goes through the CLI's `main` in
its own process, 2 at a time, with an address-space limit: no SIGABRT/SIGSEGV/SIGBUS, each done
within 2 s, and each refused file ends with exit code 2 and exactly one stderr line naming the
file and the field.  Bit flips may leave a file valid (then it loads and runs 2 tokens, and must
exit 0 or refuse it the same way).

The corpus runs in processes forked from this one after the CLI's modules are imported: a fresh
interpreter costs ~1-2 s per file on this 2-core machine (mostly importing FastAPI for the
`serve` subcommand's parser), which would make 400+ files take minutes.  `test_cli_subprocess_sample`
runs one file of every family and role through a real `python -m llama_dflash.cli bench`.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass

import pytest

from fuzz.gguf_mutations import Case, corpus
from llama_dflash.writer import write_random_draft

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forks children and reads /proc/self/status")

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


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(argv: list[str], err_path: str) -> None:
    """Runs in the forked process: the CLI's main with stdout dropped and stderr to a file."""
    code = 70
    try:
        err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + EXTRA_MEMORY,) * 2)
        from llama_dflash.cli import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report anything as a failure of the case
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_forked(items: list[tuple[Case, str, list[str]]], workdir: str, parallel: int = 2) -> list[Outcome]:
    """Each (case, path, argv) in a forked child, `parallel` at a time; children past 5x the time
    limit are killed (reported as a signal)."""
    from llama_dflash.cli import build_parser

    build_parser()  # import every subcommand module once, before forking
    pending, running, done = list(items), {}, []
    while pending or running:
        while pending and len(running) < parallel:
            case, path, argv = pending.pop(0)
            err = os.path.join(workdir, case.name + ".err")
            pid = os.fork()
            if pid == 0:
                _child(argv, err)
            running[pid] = (case, path, err, time.perf_counter())
        time.sleep(0.002)
        for pid, (case, path, err, t0) in list(running.items()):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == 0:
                if time.perf_counter() - t0 > 5 * TIME_LIMIT_S:
                    os.kill(pid, signal.SIGKILL)
                continue
            secs = time.perf_counter() - t0
            del running[pid]
            with open(err, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            done.append(Outcome(case, path, code, sig, text, secs))
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


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


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
        proc = subprocess.run([sys.executable, "-m", "llama_dflash.cli", *_argv(c, path, fixtures)],
                              capture_output=True, text=True, timeout=120, preexec_fn=_limit_memory)
        secs = time.perf_counter() - t0
        sig = -proc.returncode if proc.returncode < 0 else None
        o = Outcome(c, path, None if sig else proc.returncode, sig, proc.stderr, 0.0)
        p = problems(o)
        if p:
            failures.append(f"{c.name}: {'; '.join(p)} ({secs:.1f} s) {proc.stderr.strip()[-300:]!r}")
    assert not failures, "\n".join(failures)
