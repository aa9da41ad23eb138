"""A fork server for the fuzz corpus: `python tests/fuzz/forkserver.py --parallel N --time-limit S`.

A pytest process may have initialised CUDA (anything that asks llama.cpp for its devices does),
and a child forked from it cannot use the GPU -- nor, in general, anything a parent's threads
held.  This server is a fresh interpreter: it imports the CLI's modules (so a case does not pay
~1-2 s of imports) without touching llama.cpp's backend, then forks one child per case, so every
case starts from a process that has no GPU state at all.

Protocol, JSON lines.  Standard input: one case per line, {"name", "argv", "err"} (err: the file
the child's stderr goes to), then end of file.  Standard output: first {"ready": true,
"backend_initialised": bool} (whether this process initialised llama.cpp's backend before
forking: it must not), then {"name", "code", "sig", "seconds"} per case as each ends (code None
when killed by a signal; children past 5x the time limit are killed with SIGKILL).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
import traceback


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(argv: list[str], err_path: str, extra_memory: int) -> None:
    """Runs in the forked process: the CLI's main with stdout dropped and stderr to a file."""
    code = 70
    try:
        err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)  # never the server's protocol pipe
        os.dup2(err, 2)
        os.dup2(null, 0)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + extra_memory,) * 2)
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


def serve(cases: list[dict], parallel: int, time_limit: float, extra_memory: int, out) -> None:
    pending, running = list(cases), {}
    while pending or running:
        while pending and len(running) < parallel:
            case = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(case["argv"], case["err"], extra_memory)
            running[pid] = (case["name"], time.perf_counter())
        time.sleep(0.002)
        for pid, (name, t0) in list(running.items()):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == 0:
                if time.perf_counter() - t0 > 5 * time_limit:
                    os.kill(pid, signal.SIGKILL)
                continue
            secs = time.perf_counter() - t0
            del running[pid]
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            out.write(json.dumps({"name": name, "code": code, "sig": sig, "seconds": secs}) + "\n")
            out.flush()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=2.0)
    ap.add_argument("--extra-memory", type=int, default=1 << 30, help="bytes of address space a child may add")
    args = ap.parse_args()
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but the protocol on the pipe
    from llama_dflash import _llama
    from llama_dflash.cli import build_parser

    build_parser()  # import every subcommand module once, before forking
    initialised = bool(_llama._backend_ready)
    out.write(json.dumps({"ready": True, "backend_initialised": initialised}) + "\n")
    out.flush()
    if initialised:  # forking now would hand the children whatever the backend set up
        return 3
    cases = [json.loads(line) for line in sys.stdin if line.strip()]
    serve(cases, args.parallel, args.time_limit, args.extra_memory, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
