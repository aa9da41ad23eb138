"""`llama-dflash serve` as a real process on loopback (tiny fixtures): requests that used to kill it,
clients that stop reading or go away, and shutdown under load (issue 13, items 1, 5, 6)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

requests = pytest.importorskip("requests")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from llama_dflash.highlevel import Llama  # noqa: E402

KEY = "process-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TIMEOUT = 4.0  # the server's --request-timeout
CHECK = {"prompt": "the quick brown fox", "max_tokens": 8, "temperature": 0}
GBNF = 'root ::= ("the" | "a" | "dog") (" " ("the" | "a" | "dog"))*'
CRASH_SIGNALS = (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGBUS, -signal.SIGKILL)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(target: str, draft: str, *extra: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "llama_dflash.cli", "serve", "--model", target, "--draft-model", draft,
           "--port", str(port), "--api-key", KEY, "--n-ctx", "2048", "--n-batch", "64", "--n-threads", "1",
           "--draft-n-max", "4", "--request-timeout", str(TIMEOUT), "--max-tokens-cap", "2000", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(proc.stdout.read().decode(errors="replace"))
        try:
            if requests.get(base + "/health", timeout=1).ok:
                return proc, base
        except requests.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stdout.read().decode(errors="replace")


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft):
    proc, base = _start(tiny_target, tiny_draft)
    yield proc, base
    log = _stop(proc)
    assert proc.returncode not in CRASH_SIGNALS, log


@pytest.fixture(scope="module")
def expected(tiny_target):
    ref = Llama(tiny_target, logits_all=True, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1,
                flash_attn=True)  # as `serve` runs by default
    try:
        yield ref.create_completion(CHECK["prompt"], max_tokens=8, temperature=0)["choices"][0]["text"]
    finally:
        ref.close()


def _post(base, body, path="/v1/completions", **kw):
    return requests.post(base + path, json=body, headers=AUTH, timeout=kw.pop("timeout", 30), **kw)


def _raw(base, text, path="/v1/completions"):
    return requests.post(base + path, data=text, headers={**AUTH, "Content-Type": "application/json"}, timeout=30)


def _assert_alive_and_right(proc, base, expected):
    assert proc.poll() is None, "the server process died"
    assert requests.get(base + "/health", timeout=5).json() == {"status": "ok"}
    r = _post(base, CHECK)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected


def _endless(base) -> dict:
    """A request body that generates until the deadline: end-of-generation (id 2 in the tiny
    fixtures' vocabulary, see `writer.write_tiny_target`) banned, ~25 tokens/s here."""
    return {"prompt": "the quick", "max_tokens": 2000, "temperature": 0.8, "seed": 1, "logit_bias": {"2": -100}}


def _metric(base, name) -> float:
    text = requests.get(base + "/metrics", headers=AUTH, timeout=5).text
    for line in text.splitlines():
        if line.startswith(f"llama_dflash_{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


@pytest.mark.parametrize("body", [
    '{"prompt": "the", "max_tokens": 8, "grammar": %s, "presence_penalty": NaN}' % json.dumps(GBNF),
    '{"prompt": "the", "max_tokens": 8, "grammar": %s, "frequency_penalty": -1e999}' % json.dumps(GBNF),
    json.dumps({"prompt": "the", "max_tokens": 8, "grammar": GBNF, "frequency_penalty": -1e30}),
    json.dumps({"prompt": "the", "max_tokens": 4, "grammar": "root ::= " + "(" * 30000 + '"a"' + ")" * 30000}),
    json.dumps({"prompt": "the", "max_tokens": 2, "seed": [1, 2]}),
], ids=["nan-presence", "neg-inf-frequency", "huge-frequency", "nested-grammar", "list-seed"])
def test_requests_that_killed_or_poisoned_the_server(server, expected, body):
    proc, base = server
    r = _raw(base, body)
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    _assert_alive_and_right(proc, base, expected)


def test_loopback_host_check(server):
    _, base = server
    port = base.rsplit(":", 1)[1]
    r = requests.get(base + "/v1/models", headers={**AUTH, "Host": f"attacker.example:{port}"}, timeout=5)
    assert r.status_code == 421
    assert requests.get(base + "/v1/models", headers={**AUTH, "Host": f"localhost:{port}"}, timeout=5).ok
    r = requests.post(base + "/v1/completions", data=json.dumps(CHECK),
                      headers={**AUTH, "Content-Type": "text/plain"}, timeout=5)
    assert r.status_code == 415


def test_client_that_stops_reading_cannot_hold_the_model(server, expected):
    proc, base = server
    stuck = _post(base, dict(_endless(base), stream=True), stream=True)  # headers read, body never
    try:
        assert stuck.status_code == 200
        t0 = time.monotonic()
        time.sleep(TIMEOUT / 3)  # so that this request's own deadline outlasts the stuck one's
        r = _post(base, CHECK, timeout=TIMEOUT + 10)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected
        assert time.monotonic() - t0 < TIMEOUT + 5
    finally:
        stuck.close()
    _assert_alive_and_right(proc, base, expected)


def test_non_streamed_request_past_its_deadline_is_504(server, expected):
    proc, base = server
    t0 = time.monotonic()
    r = _post(base, _endless(base), timeout=TIMEOUT + 20)
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
    assert time.monotonic() - t0 < TIMEOUT + 5
    _assert_alive_and_right(proc, base, expected)


def test_clients_gone_while_queued_are_not_served(server, expected):
    proc, base = server
    before = _metric(base, "requests_total")
    holder = _post(base, dict(_endless(base), stream=True), stream=True)
    try:
        lines = holder.iter_lines()
        next(lines)  # the model is busy now

        def impatient():
            try:
                _post(base, dict(CHECK, max_tokens=16), timeout=0.5)
            except requests.RequestException:
                pass

        threads = [threading.Thread(target=impatient) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for _ in lines:  # until the holder's deadline ends its stream
            pass
    finally:
        holder.close()
    time.sleep(0.5)
    _assert_alive_and_right(proc, base, expected)
    # the holder and the check were served; the two that left while queued were not
    assert _metric(base, "requests_total") - before == 1


def test_early_disconnect_frees_the_model(server, expected):
    proc, base = server
    with _post(base, dict(_endless(base), stream=True), stream=True) as r:
        next(r.iter_lines())
    t0 = time.monotonic()
    _assert_alive_and_right(proc, base, expected)
    assert time.monotonic() - t0 < TIMEOUT - 1  # not after the abandoned stream's deadline


def test_empty_api_key_refused_at_startup(tiny_target):
    for env, args in (({}, ["--api-key", ""]), ({"LLAMA_DFLASH_API_KEY": ""}, [])):
        proc = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "serve", "--model", tiny_target, *args],
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "api-key" in proc.stderr and "Traceback" not in proc.stderr


def test_shutdown_during_a_stream(tiny_target, tiny_draft):
    proc, base = _start(tiny_target, tiny_draft)
    try:
        with _post(base, dict(_endless(base), stream=True), stream=True) as r:
            lines = r.iter_lines()
            next(lines)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        # the running generation stopped at its next token with an error event, well before its deadline
        assert time.monotonic() - t0 < TIMEOUT - 1
        assert rest and rest[-1].startswith(b"data: ") and b"shutting_down" in rest[-1], rest[-3:]
        proc.wait(15)
    finally:
        log = _stop(proc)
    assert proc.returncode in (0, -signal.SIGTERM), log
    assert "Traceback" not in log and "terminate called" not in log, log


def test_large_frees_go_back_to_the_os_in_a_child():
    """The server fixes glibc's mmap threshold (its prompt cache's states then leave no heap
    holes behind); an explicit MALLOC_MMAP_THRESHOLD_ is the user's and is left alone."""
    import os
    import subprocess
    import sys

    code = "from llama_dflash.server.cli import return_large_frees_to_os as f; print(f())"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("True" if sys.platform.startswith("linux") else "False")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(env, MALLOC_MMAP_THRESHOLD_="65536"))
    assert out.stdout.strip() == "False"


def test_drafting_for_a_hybrid_target_in_a_batch_refused_at_startup(tmp_path):
    """`serve --parallel 2` on a hybrid target with a drafter: one line, exit code 2, before any
    request (a rejected draft cannot be cut from a sequence's recurrent state)."""
    from llama_dflash.tiny_qwen3next import write_tiny_qwen3next

    hybrid = write_tiny_qwen3next(str(tmp_path / "q3n.gguf"))
    proc = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "serve", "--model", hybrid, "--parallel", "2",
                           "--spec-type", "ngram-simple", "--n-ctx", "256"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "cannot draft for recurrent or hybrid" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
