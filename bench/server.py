"""Tokens/s through `llama-dflash serve`: speculative vs ordinary, side by side in one run.

    . .venv/bin/activate && python bench/server.py [--requests 4] [--max-tokens 128] [--draft-tokens auto]

Starts two servers on 127.0.0.1 (SmolLM2 alone, and SmolLM2 with the default trained draft),
sends the same chat requests to both in alternation (temperature 0, non-streaming and
streaming), checks that the answers are identical, and prints completion tokens per second of
wall time per server (medians), their ratio, and the speculative counters from /metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from llama_dflash.bench.workloads import workload_prompts
from llama_dflash.defaults import default_draft_path, smollm2_path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "llama_dflash.cli", "serve", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stderr.read()}")
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not start")


def _chat(port: int, prompt: str, max_tokens: int, stream: bool) -> tuple[str, int, float]:
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": stream}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        if not stream:
            d = json.loads(r.read())
            return d["choices"][0]["message"]["content"], d["usage"]["completion_tokens"], time.perf_counter() - t0
        text, chunks = "", 0
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if delta.get("content"):
                text += delta["content"]
                chunks += 1
        return text, chunks, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4, help="prompts (from the structured workload)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-tokens", default="auto")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    model = smollm2_path()
    common = ["--model", model, "--n-threads", str(a.threads)]
    servers = {"ordinary": (common, _free_port()),
               "speculative": (common + ["--draft-model", default_draft_path(model), "--draft-n-max", a.draft_tokens],
                               _free_port())}
    procs = {name: _start(args, port) for name, (args, port) in servers.items()}
    try:
        rates: dict[tuple[str, bool], list[float]] = {}
        same = True
        for prompt in workload_prompts("structured")[: a.requests]:
            for stream in (False, True):
                answers = {}
                for name, (_, port) in servers.items():
                    text, n, dt = _chat(port, prompt, a.max_tokens, stream)
                    answers[name] = text
                    rates.setdefault((name, stream), []).append(n / dt)
                same &= answers["ordinary"] == answers["speculative"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{servers['speculative'][1]}/metrics").read().decode()
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(timeout=30)
    print(f"SmolLM2-135M through llama-dflash serve, {a.requests} chat requests x {a.max_tokens} tokens, "
          f"temperature 0, draft tokens {a.draft_tokens}; answers identical: {same}")
    for stream in (False, True):
        o = statistics.median(rates[("ordinary", stream)])
        s = statistics.median(rates[("speculative", stream)])
        kind = "streaming" if stream else "non-streaming"
        print(f"  {kind:<14}: ordinary {o:7.2f} tok/s   speculative {s:7.2f} tok/s   ratio {s / o:.3f}")
    print("  /metrics (speculative server):")
    for line in metrics.splitlines():
        if line and not line.startswith("#"):
            print("    " + line)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
