"""Load test of `llama-dflash serve`: N concurrent clients on loopback, every answer checked.

    . .venv/bin/activate && python bench/load.py [--clients 8] [--duration 60] [--requests 0] [--no-draft]
    python bench/load.py --servers llama-dflash,llama-server --parallel 4 --clients 1,4,8 --duration 30

`--servers llama-dflash,llama-server` puts the same load on llama.cpp's own server (`-np` = --parallel,
`-c` = --n-ctx x --parallel, flash attention on, the draft as `--spec-type draft-dspark|draft-dflash`)
built by ../shared/tools/build-cpp-reference.sh, each judged against its own sequential answers, and
prints a table side by side: aggregate completion tokens/s, requests/s, latency and time to first
token p50/p99, errors and wrong answers per client count.

Starts `llama-dflash serve` on 127.0.0.1 (a free port; SmolLM2 with the default draft unless
--model/--draft/--no-draft say otherwise), asks each distinct request once, sequentially, for
the reference answer (chat and completion prompts at temperature 0, and one seeded request at
temperature 0.8), then lets N client threads send those requests in a loop -- non-streamed and
streamed (SSE) in turn, one streamed request in --disconnect-every closing its connection after
the first chunks -- until --duration seconds or --requests requests.  Every finished answer must
equal its reference (text and finish reason), and the text an early-closed stream received must
be a prefix of it.  Afterwards /health and one more sequential round must still be right.

Prints requests/s, completion tokens/s, latency p50/p99 (and time to the first streamed chunk),
errors, wrong answers, 503s from a full queue (reported apart: --max-queue below the client
count makes them by design) and the server's resident memory before and after; --json PATH
writes the same as JSON.  Exit status 1 when anything was wrong or failed, 0 otherwise.
Standard library only (threads and http.client), so nothing beyond the server's extra is needed.

The server runs as users run it: `--draft-tokens auto` and flash attention on (serve's defaults).
Flash attention matters here: without it a quantized CPU build computes a verification batch's
attention with another kernel than a single-token decode, a greedy near-tie can flip, and auto's
timing-driven draft lengths made answers change between runs (tests/server/test_flash_attn_default.py).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
if (REPO / "llama_dflash").is_dir():  # this checkout's package (for the default model's path), not another install
    sys.path.insert(0, str(REPO))

#: the distinct requests: (name, path, body); temperature 0 unless the body says otherwise
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("chat-capital", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]}),
    ("chat-list", "/v1/chat/completions",
     {"messages": [{"role": "system", "content": "You are a concise assistant."},
                   {"role": "user", "content": "List three fruits that are red."}]}),
    ("chat-explain", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Explain in two sentences why the sky is blue."}]}),
    ("completion-story", "/v1/completions", {"prompt": "Once upon a time, in a small village by the sea,"}),
    ("completion-code", "/v1/completions",
     {"prompt": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"}),
    ("chat-seeded", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Write a short poem about autumn."}], "temperature": 0.8,
      "seed": 1234}),
]


# ---- one request ------------------------------------------------------------------------------------
@dataclass
class Reply:
    """What one request got back.  `status`: the HTTP status, or 0 when none arrived."""

    status: int = 0
    text: str = ""
    finish_reason: Optional[str] = None
    completion_tokens: Optional[int] = None
    latency: float = 0.0
    first_chunk: Optional[float] = None  # streams: seconds to the first event with text (first token)
    closed_early: bool = False  # we closed the stream on purpose
    error: str = ""  # transport failure, error body or error event, malformed reply

    @property
    def answer(self) -> tuple[str, Optional[str]]:
        return self.text, self.finish_reason


def _choice_text(choice: dict[str, Any], stream: bool) -> str:
    if "message" in choice:
        return choice["message"].get("content") or ""
    if stream and "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


def send(port: int, path: str, body: dict[str, Any], stream: bool, timeout: float,
         close_after: Optional[int] = None) -> Reply:
    """POST `body` to `path`; with `close_after`, close a stream after that many data events."""
    reply = Reply()
    data = json.dumps(dict(body, stream=stream)).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    resp = None
    t0 = time.perf_counter()
    try:
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        reply.status = resp.status
        if resp.status != 200:
            reply.error = resp.read().decode(errors="replace")[:300]
        elif not stream:
            choice = json.loads(resp.read())
            reply.completion_tokens = choice.get("usage", {}).get("completion_tokens")
            choice = choice["choices"][0]
            reply.text, reply.finish_reason = _choice_text(choice, False), choice.get("finish_reason")
        else:
            _read_stream(resp, reply, t0, close_after)
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as exc:
        reply.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if resp is not None:
            resp.close()
        conn.close()  # after resp.close(): the socket is really closed, the server sees the client go
        reply.latency = time.perf_counter() - t0
    return reply


def _read_stream(resp: http.client.HTTPResponse, reply: Reply, t0: float, close_after: Optional[int]) -> None:
    events = 0
    done = False
    event_name = ""
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            event_name = line[6:].strip()
            continue
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if event_name == "error":
            reply.error = f"error event: {payload[:300]}"
            return
        if payload == "[DONE]":
            done = True
            break
        choice = json.loads(payload)["choices"][0]
        piece = _choice_text(choice, True)
        if piece and reply.first_chunk is None:  # a chat stream's first event (the role) carries no text
            reply.first_chunk = time.perf_counter() - t0
        reply.text += piece
        reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
        events += 1
        if close_after is not None and events >= close_after:
            reply.closed_early = True
            return
    if not done:
        reply.error = "stream ended without [DONE]"


# ---- checking answers -------------------------------------------------------------------------------
def check(reference: tuple[str, Optional[str]], reply: Reply) -> Optional[str]:
    """None when `reply` agrees with `reference` (text, finish_reason), else what differs.  A
    stream closed early on purpose must have received a prefix of the reference text."""
    ref_text, ref_finish = reference
    if reply.closed_early:
        if ref_text.startswith(reply.text):
            return None
        return f"partial text {reply.text!r} is not a prefix of {ref_text!r}"
    if reply.text != ref_text:
        return f"text {reply.text!r} != reference {ref_text!r}"
    if reply.finish_reason != ref_finish:
        return f"finish_reason {reply.finish_reason!r} != reference {ref_finish!r}"
    return None


# ---- the load -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    case: str
    stream: bool
    kind: str  # "ok", "wrong", "error", "rejected", "disconnected"
    latency: float
    first_chunk: Optional[float]
    tokens: int
    detail: str = ""


@dataclass
class Plan:
    """Which request the k-th one is: each case in turn, streamed every other round."""

    cases: list[tuple[str, str, dict[str, Any]]]
    disconnect_every: int  # 0: never

    def request(self, k: int) -> tuple[int, bool, bool]:
        """(case index, streamed, closed early) of request number `k`."""
        n = len(self.cases)
        index, stream = k % n, (k // n) % 2 == 1
        n_streamed_before = (k // (2 * n)) * n + (k % n if stream else 0)  # streamed requests before k
        # spread over the cases: not always the same one when disconnect_every is a multiple of n
        turn = n_streamed_before + n_streamed_before // n
        early = stream and self.disconnect_every > 0 and turn % self.disconnect_every == 0
        return index, stream, early


@dataclass
class Load:
    port: int
    plan: Plan
    references: dict[bool, list[tuple[str, Optional[str]]]]  # keyed by `stream`
    tokens: list[int]  # completion tokens of each reference answer
    timeout: float
    max_requests: int  # 0: no limit
    deadline: float  # time.monotonic() after which no request starts
    close_after: int = 2
    outcomes: list[Outcome] = field(default_factory=list)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def _take(self) -> Optional[int]:
        with self._lock:
            if self.stop.is_set() or time.monotonic() >= self.deadline or (
                    self.max_requests and self._next >= self.max_requests):
                return None
            self._next += 1
            return self._next - 1

    def client(self) -> None:
        while (k := self._take()) is not None:
            index, stream, early = self.plan.request(k)
            name, path, body = self.plan.cases[index]
            reply = send(self.port, path, body, stream, self.timeout, self.close_after if early else None)
            outcome = classify(name, stream, reply, self.references[stream][index], self.tokens[index])
            with self._lock:
                self.outcomes.append(outcome)


def classify(name: str, stream: bool, reply: Reply, reference: tuple[str, Optional[str]], tokens: int) -> Outcome:
    if reply.status == 503 and "queue_full" in reply.error:
        kind, detail = "rejected", reply.error
    elif reply.error or reply.status != 200:
        kind, detail = "error", f"HTTP {reply.status}: {reply.error}"
    else:
        detail = check(reference, reply) or ""
        kind = "wrong" if detail else ("disconnected" if reply.closed_early else "ok")
    return Outcome(name, stream, kind, reply.latency, reply.first_chunk, tokens if kind == "ok" else 0, detail)


def percentile(values: list[float], q: float) -> Optional[float]:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(outcomes: list[Outcome], wall: float) -> dict[str, Any]:
    count = {k: sum(o.kind == k for o in outcomes) for k in ("ok", "wrong", "error", "rejected", "disconnected")}
    done = [o for o in outcomes if o.kind == "ok"]
    firsts = [o.first_chunk for o in outcomes if o.stream and o.kind in ("ok", "disconnected") and o.first_chunk]
    lat = [o.latency for o in done]
    return {
        "requests_sent": len(outcomes), "completed": count["ok"], "completed_streamed": sum(o.stream for o in done),
        "disconnected_early": count["disconnected"], "rejected_queue_full": count["rejected"],
        "errors": count["error"], "wrong_answers": count["wrong"], "wall_seconds": wall,
        "requests_per_second": count["ok"] / wall if wall > 0 else 0.0,
        "completion_tokens_per_second": sum(o.tokens for o in done) / wall if wall > 0 else 0.0,
        "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
        "first_chunk_p50_s": percentile(firsts, 50), "first_chunk_p99_s": percentile(firsts, 99),
        "failures": [asdict(o) for o in outcomes if o.kind in ("wrong", "error")][:20],
    }


def failed(report: dict[str, Any]) -> bool:
    """Whether the run found anything wrong (the exit status is 1 then)."""
    return bool(report.get("errors") or report.get("wrong_answers") or report["reference_problems"]
                or report["after_problems"] or not report["health_ok"] or report["server_crashed"]
                or not report.get("completed"))


# ---- the server -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> Optional[bytes]:
    """The body of GET `path`, or None when it fails."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            return body if resp.status == 200 else None
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return None


def health(port: int) -> bool:
    body = _get(port, "/health")
    try:
        return body is not None and json.loads(body) == {"status": "ok"}
    except ValueError:
        return False


def speculative_metrics(port: int) -> dict[str, float]:
    """Acceptance rate and tokens per verification step from /metrics (over every request)."""
    out: dict[str, float] = {}
    for line in (_get(port, "/metrics") or b"").decode(errors="replace").splitlines():
        for name in ("acceptance_rate", "tokens_per_step"):
            if line.startswith(f"llama_dflash_{name}{{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


def batch_metrics(port: int) -> dict[str, float]:
    """The batched engine's counters from /metrics (batch_*: steps, rows, busy/decode/prefill seconds)."""
    out: dict[str, float] = {}
    for line in (_get(port, "/metrics") or b"").decode(errors="replace").splitlines():
        if line.startswith(("llama_dflash_batch_", "llama_dflash_prompt_cache_bytes")):
            name, _, value = line.partition(" ")
            try:
                out[name.split("{", 1)[0][len("llama_dflash_"):]] = float(value.rsplit(" ", 1)[-1])
            except ValueError:
                pass
    return out


def _default_llama_server() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "llama-cpp-reference", "build", "bin", "llama-server")


def start_server(cmd: list[str], port: int, log, timeout: float = 180.0,
                 env: Optional[dict[str, str]] = None) -> subprocess.Popen:
    """Start `cmd` (a server listening on `port`) and wait until /health answers."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        if health(port):
            return proc
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"the server did not answer /health within {timeout:g} s")


def stop_server(proc: subprocess.Popen) -> Optional[int]:
    """Terminate, then kill after 30 s; the exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _sample_rss(pid: int, out: list, stop: threading.Event, every: float = 10.0,
                port: Optional[int] = None, cache: Optional[list] = None) -> None:
    """RSS every `every` seconds into `out`; with `port` and `cache`, the host prompt cache's
    size from /metrics at the same moments (memory the server holds on purpose, up to --cache-ram)."""
    t0 = time.monotonic()
    while not stop.wait(every):
        mb = rss_mb(pid)
        if mb is not None:
            t = round(time.monotonic() - t0, 1)
            out.append([t, mb])
            if port is not None and cache is not None:
                cache.append([t, round(batch_metrics(port).get("prompt_cache_bytes", 0.0) / 2 ** 20, 1)])


def rss_mb(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# ---- main ---------------------------------------------------------------------------------------------
def _client_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"client counts must be >= 1: {text!r}")
    return counts


SERVERS = ("llama-dflash", "llama-server")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=_client_counts, default=[8],
                    help="concurrent client threads, or a comma list (1,4,8: one load after the other on the "
                         "same server; default 8)")
    ap.add_argument("--duration", type=float, default=60.0,
                    help="seconds of load; no request starts after (default %(default)s)")
    ap.add_argument("--requests", type=int, default=0, help="stop after this many requests (default 0: no limit)")
    ap.add_argument("--max-tokens", type=int, default=40, help="max_tokens of every request (default %(default)s)")
    ap.add_argument("--disconnect-every", type=int, default=6,
                    help="one streamed request in this many closes after --close-after chunks (0: never)")
    ap.add_argument("--close-after", type=int, default=2,
                    help="chunks an early-closed stream reads (default %(default)s)")
    ap.add_argument("--model", help="target GGUF (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--draft", help="draft GGUF (default: the model's default draft)")
    ap.add_argument("--no-draft", action="store_true", help="the ordinary server, without a draft")
    ap.add_argument("--draft-tokens", default="auto", help="the server's --draft-tokens (default %(default)s)")
    ap.add_argument("--parallel", type=int, default=None,
                    help="the server's --parallel (llama-server's -np): requests decoded together "
                         "(default: not passed to llama-dflash serve; 1 for llama-server)")
    ap.add_argument("--servers", default="llama-dflash",
                    help="comma list of the servers to load one after the other, printed side by side: "
                         "llama-dflash, llama-server (default %(default)s)")
    ap.add_argument("--llama-server", default=_default_llama_server(), metavar="PATH",
                    help="llama.cpp's llama-server binary (default: ../shared/tools/build-cpp-reference.sh's)")
    ap.add_argument("--llama-server-spec-type", default=None,
                    help="llama-server's --spec-type with the draft (default: draft-dspark or draft-dflash, "
                         "from the draft file)")
    ap.add_argument("--llama-server-draft-max", type=int, default=4,
                    help="llama-server's --spec-draft-n-max with the draft (default %(default)s)")
    ap.add_argument("--max-queue", type=int, default=None,
                    help="the server's --max-queue (default: 2 x clients, at least 16, so none is refused)")
    ap.add_argument("--request-timeout", type=float, default=300.0, help="the server's --request-timeout")
    ap.add_argument("--n-threads", type=int, default=None, help="the servers' thread count (--n-threads, -t)")
    ap.add_argument("--n-ctx", type=int, default=2048, help="context of each request (slot); llama-server gets "
                                                          "-c N x --parallel")
    ap.add_argument("--no-seeded", action="store_true", help="leave out the seeded temperature-0.8 request")
    ap.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    a = ap.parse_args(argv)
    if a.duration <= 0 or a.requests < 0 or a.max_tokens < 1 or a.close_after < 1 \
            or a.disconnect_every < 0:
        ap.error("--duration, --max-tokens, --close-after must be > 0; --requests, --disconnect-every >= 0")
    if a.no_draft and a.draft:
        ap.error("--draft and --no-draft exclude each other")
    if a.parallel is not None and a.parallel < 1:
        ap.error("--parallel must be >= 1")
    a.servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    bad = [s for s in a.servers if s not in SERVERS]
    if bad or not a.servers:
        ap.error(f"--servers takes {', '.join(SERVERS)}, not {','.join(bad) or 'nothing'}")
    return a


def server_args(a: argparse.Namespace) -> tuple[list[str], str, Optional[str]]:
    """`llama-dflash serve`'s command-line options, the model and the draft paths."""
    from llama_dflash.defaults import default_draft_path, smollm2_path

    model = a.model or smollm2_path()
    draft = None if a.no_draft else (a.draft or default_draft_path(model))
    args = ["--model", model, "--n-ctx", str(a.n_ctx), "--max-tokens-cap", str(max(a.max_tokens, 16)),
            "--max-queue", str(a.max_queue if a.max_queue is not None else max(16, 2 * max(a.clients))),
            "--request-timeout", str(a.request_timeout)]
    if draft:
        args += ["--draft-model", draft, "--draft-tokens", a.draft_tokens]
    if a.n_threads:
        args += ["--n-threads", str(a.n_threads)]
    if a.parallel is not None:
        args += ["--parallel", str(a.parallel)]
    return args, model, draft


def llama_server_spec_type(draft: str) -> str:
    """llama-server's --spec-type for a draft file: draft-dspark for a DSpark draft, else draft-dflash."""
    try:
        from llama_dflash.inspect import detect_algorithm, read_draft

        return "draft-dspark" if detect_algorithm(read_draft(draft)) == "dspark" else "draft-dflash"
    except Exception:  # noqa: BLE001 - a guess from the name is as good where the file cannot be read
        return "draft-dspark" if "dspark" in os.path.basename(draft) else "draft-dflash"


def llama_server_command(a: argparse.Namespace, model: str, draft: Optional[str], port: int) -> list[str]:
    """The same pair and settings on llama.cpp's own server (`-np` slots of --n-ctx each, flash attention on)."""
    n_par = a.parallel or 1
    cmd = [a.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(n_par),
           "-c", str(a.n_ctx * n_par), "-fa", "on", "--no-webui"]
    if a.n_threads:
        cmd += ["-t", str(a.n_threads)]
    if draft:
        cmd += ["-md", draft, "--spec-type", a.llama_server_spec_type or llama_server_spec_type(draft),
                "--spec-draft-n-max", str(a.llama_server_draft_max)]
    return cmd


def reference_round(port: int, cases: list, timeout: float, stream: bool) -> tuple[list[Reply], list[str]]:
    """Each case once, sequentially; the failures among them."""
    replies, problems = [], []
    for name, path, body in cases:
        r = send(port, path, body, stream, timeout)
        replies.append(r)
        if r.error or r.status != 200:
            problems.append(f"{name} ({'stream' if stream else 'plain'}): HTTP {r.status}: {r.error}")
    return replies, problems


def references(port: int, cases: list, timeout: float) -> tuple[dict[bool, list[Reply]], list[str], list[str]]:
    """The reference answers, plain and streamed (keyed by `stream`); the problems (failures, a
    plain answer that differs between two quiet runs); the cases whose streamed text differs from
    the plain one (llama-cpp-python's streaming drops multi-byte characters split across tokens)."""
    plain, problems = reference_round(port, cases, timeout, False)
    streamed, more = reference_round(port, cases, timeout, True)
    again, more2 = reference_round(port, cases, timeout, False)
    problems += more + more2 + [f"{c[0]}: not reproducible: {x.answer!r} then {y.answer!r}"
                                for c, x, y in zip(cases, plain, again)
                                if not (x.error or y.error) and x.answer != y.answer]
    differ = [f"{c[0]}: plain {x.answer!r}, streamed {y.answer!r}" for c, x, y in zip(cases, plain, streamed)
              if not (x.error or y.error) and x.answer != y.answer]
    return {False: plain, True: streamed}, problems, differ


def _load(a: argparse.Namespace, port: int, cases: list, refs: dict[bool, list[Reply]], clients: int,
          timeout: float) -> dict[str, Any]:
    """`clients` threads sending the cases until the duration or the request count is reached."""
    answers = {mode: [r.answer for r in refs[mode]] for mode in refs}
    load = Load(port, Plan(cases, a.disconnect_every), answers, [r.completion_tokens or 0 for r in refs[False]],
                timeout, a.requests, time.monotonic() + a.duration, a.close_after)
    threads = [threading.Thread(target=load.client, daemon=True, name=f"client-{i}") for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    except BaseException:
        load.stop.set()
        raise
    return summarize(load.outcomes, time.perf_counter() - t0)


def run_server(a: argparse.Namespace, server: str = "llama-dflash") -> list[dict[str, Any]]:
    """One report per client count of `a.clients`, all against one `server` started once."""
    args, model, draft = server_args(a)
    cases = [(n, p, dict(b, max_tokens=a.max_tokens, **({} if "temperature" in b else {"temperature": 0})))
             for n, p, b in CASES if not (a.no_seeded and "seed" in b)]
    timeout = a.request_timeout + 30
    port = free_port()
    if server == "llama-server":
        if not os.access(a.llama_server, os.X_OK):
            raise RuntimeError(f"no llama-server at {a.llama_server} (build it with "
                               "../shared/tools/build-cpp-reference.sh or pass --llama-server)")
        cmd, env = llama_server_command(a, model, draft, port), None
    else:
        env = dict(os.environ)
        if (REPO / "llama_dflash").is_dir():  # this checkout's package, not whichever one is installed
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "llama_dflash.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    base: dict[str, Any] = {"server": server, "model": os.path.basename(model),
                            "draft": os.path.basename(draft) if draft else None,
                            "parallel": a.parallel, "duration_s": a.duration, "max_requests": a.requests,
                            "max_tokens": a.max_tokens, "server_args": cmd[1:] if server == "llama-server" else args,
                            "reference_problems": [], "stream_differs_from_plain": [], "after_problems": [],
                            "health_ok": False, "server_crashed": False}
    reports: list[dict[str, Any]] = []
    with tempfile.TemporaryFile() as log:
        proc = start_server(cmd, port, log, env=env)
        try:
            refs, base["reference_problems"], base["stream_differs_from_plain"] = references(port, cases, timeout)
            for clients in a.clients:
                report = dict(base, clients=clients)
                reports.append(report)
                if base["reference_problems"]:
                    break
                report["rss_before_mb"] = rss_mb(proc.pid)
                before = batch_metrics(port) if server == "llama-dflash" else {}
                samples, cache, stop = [], [], threading.Event()
                sampler = threading.Thread(target=_sample_rss, args=(proc.pid, samples, stop),
                                           kwargs=dict(port=port if server == "llama-dflash" else None,
                                                       cache=cache), daemon=True)
                sampler.start()
                try:
                    report.update(_load(a, port, cases, refs, clients, timeout))
                finally:
                    stop.set()
                    sampler.join()
                report["rss_after_mb"] = rss_mb(proc.pid)
                report["rss_samples_mb"] = samples  # [seconds into the load, MB] every 10 s
                if cache:
                    report["prompt_cache_samples_mb"] = cache  # the same moments: the host prompt cache
                report["health_ok"] = health(port)
                if before:  # what the engine did during this load (counters' differences)
                    after = batch_metrics(port)
                    report["batch"] = {k: round(v - before.get(k, 0.0), 4) if k.endswith("_total") else v
                                       for k, v in after.items()}
                report["speculative"] = speculative_metrics(port) if draft and server == "llama-dflash" else {}
            report = reports[-1]
            if "completed" in report:
                answers = {mode: [r.answer for r in refs[mode]] for mode in refs}
                for mode in (False, True):  # the model must still answer right after all that
                    after, problems = reference_round(port, cases, timeout, mode)
                    report["after_problems"] += problems + [
                        f"{c[0]} ({'stream' if mode else 'plain'}): after the load: {check(ref, r)}"
                        for c, ref, r in zip(cases, answers[mode], after) if not r.error and check(ref, r)]
        finally:
            code = stop_server(proc)
            crashed = code is not None and code < 0 and code != -signal.SIGTERM
            log.seek(0)
            text = log.read().decode(errors="replace")
            for report in reports:
                report["server_exit_status"] = code
                report["server_crashed"] = crashed
                report["server_log_tail"] = text[-2000:] if ("Traceback" in text or crashed) else ""
    return reports


def run(a: argparse.Namespace) -> dict[str, Any]:
    """The single report of one server under one client count (`a.clients` holds one)."""
    return run_server(a, a.servers[0])[0]


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def print_report(r: dict[str, Any]) -> None:
    print(f"{r.get('server', 'llama-dflash')} under load: {r['model']} + "
          f"{r['draft'] or 'no draft (ordinary decoding)'}, {r['clients']} clients"
          + (f", parallel {r['parallel']}" if r.get("parallel") else "") + f", {r['duration_s']:g} s"
          + (f" or {r['max_requests']} requests" if r["max_requests"] else "") + f", max_tokens {r['max_tokens']}")
    for p in r["reference_problems"]:
        print(f"  reference run: {p}")
    for p in r["stream_differs_from_plain"]:  # not a failure: llama-cpp-python's streaming, checked per mode
        print(f"  note: streamed text differs from the plain one: {p[:300]}")
    if "completed" in r:
        print(f"  requests: {r['requests_sent']} sent, {r['completed']} completed "
              f"({r['completed_streamed']} streamed), "
              f"{r['disconnected_early']} disconnected early, {r['rejected_queue_full']} rejected (queue full)")
        print(f"  errors: {r['errors']}   wrong answers: {r['wrong_answers']}")
        print(f"  throughput: {r['requests_per_second']:.2f} requests/s, "
              f"{r['completion_tokens_per_second']:.1f} completion tokens/s over {r['wall_seconds']:.1f} s")
        print(f"  latency: p50 {_ms(r['latency_p50_s'])}, p99 {_ms(r['latency_p99_s'])};  "
              f"first streamed token: p50 {_ms(r['first_chunk_p50_s'])}, p99 {_ms(r['first_chunk_p99_s'])}")
        before, after = r.get("rss_before_mb"), r.get("rss_after_mb")
        if before and after:
            print(f"  server RSS: {before:.1f} MB before, {after:.1f} MB after")
            samples = r.get("rss_samples_mb") or []
            if len(samples) >= 4:  # the second half of the run: flat, or growing?
                half = [mb for _, mb in samples[len(samples) // 2:]]
                print(f"  server RSS over the load: {len(samples)} samples every 10 s; second half "
                      f"{min(half):.1f}-{max(half):.1f} MB (first {samples[0][1]:.1f}, last {samples[-1][1]:.1f})")
                cache = r.get("prompt_cache_samples_mb") or []
                if len(cache) == len(samples):  # RSS less what the prompt cache holds on purpose
                    rest = [mb - c for (_, mb), (_, c) in zip(samples, cache)]
                    h = rest[len(rest) // 2:]
                    print(f"  of which the host prompt cache (--cache-ram): {cache[0][1]:.1f} -> {cache[-1][1]:.1f} MB; "
                          f"RSS less the cache: second half {min(h):.1f}-{max(h):.1f} MB "
                          f"(first {rest[0]:.1f}, last {rest[-1]:.1f})")
        bt = r.get("batch") or {}
        if bt.get("batch_steps_total"):  # where the engine thread's time went during this load
            wall = r["wall_seconds"] or 1.0
            steps = bt["batch_steps_total"]
            print(f"  engine: {steps:.0f} decodes of {bt.get('batch_rows_total', 0) / steps:.2f} rows each; busy "
                  f"{bt.get('batch_step_seconds_total', 0) / wall:.0%} of the wall time: decodes "
                  f"{bt.get('batch_decode_seconds_total', 0) / wall:.0%}, "
                  f"prefills {bt.get('batch_prefill_seconds_total', 0) / wall:.0%}")
        if r.get("speculative"):
            spec = r["speculative"]
            print(f"  speculative (/metrics, all requests): acceptance rate {spec.get('acceptance_rate', 0):.3f}, "
                  f"tokens per verification step {spec.get('tokens_per_step', 0):.2f}")
        for f in r["failures"]:
            print(f"  {f['kind']}: {f['case']} ({'stream' if f['stream'] else 'plain'}): {f['detail'][:200]}")
    if "completed" not in r:
        print("  load not run: the reference answers are not usable (above)")
    else:
        print(f"  /health after the load: {'ok' if r['health_ok'] else 'FAILED'};  answers after the load: "
              + ("right" if not r["after_problems"] else "; ".join(r["after_problems"])))
    print(f"  server exit status: {r['server_exit_status']}" + (" (crashed)" if r["server_crashed"] else ""))
    if r["server_log_tail"]:
        print("  server log (tail):\n" + r["server_log_tail"])
    print("RESULT: " + ("FAILED" if failed(r) else "ok"))


def side_by_side(reports: list[dict[str, Any]]) -> str:
    """A markdown table: one row per (client count, server)."""
    head = ("| clients | server | parallel | draft | tok/s (aggregate) | req/s | latency p50 | latency p99 "
            "| TTFT p50 | TTFT p99 | errors | wrong |")
    rows = [head, "|" + "---|" * 12]
    for r in sorted(reports, key=lambda r: (r["clients"], SERVERS.index(r.get("server", "llama-dflash")))):
        if "completed" not in r:
            rows.append(f"| {r['clients']} | {r.get('server')} | - | - | not run | | | | | | | |")
            continue
        rows.append(f"| {r['clients']} | {r.get('server')} | {r.get('parallel') or 1} | {r['draft'] or '-'} "
                    f"| {r['completion_tokens_per_second']:.1f} | {r['requests_per_second']:.2f} "
                    f"| {_ms(r['latency_p50_s'])} | {_ms(r['latency_p99_s'])} | {_ms(r['first_chunk_p50_s'])} "
                    f"| {_ms(r['first_chunk_p99_s'])} | {r['errors']} | {r['wrong_answers']} |")
    return "\n".join(rows)


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM too stops the server on the way out
    reports: list[dict[str, Any]] = []
    try:
        for server in a.servers:
            reports += run_server(a, server)
    except KeyboardInterrupt:
        print("interrupted: the server was stopped", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"load.py: {exc}", file=sys.stderr)
        return 2
    for report in reports:
        print_report(report)
    if len(reports) > 1:
        print()
        print(side_by_side(reports))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(reports[0] if len(reports) == 1 else {"runs": reports}, fh, indent=2)
    return 1 if any(failed(r) for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
