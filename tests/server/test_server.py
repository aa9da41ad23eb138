"""`llama-dflash serve` in a subprocess on 127.0.0.1 with a free port (tiny fixtures)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

requests = pytest.importorskip("requests")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from llama_dflash.highlevel import Llama  # noqa: E402

KEY = "test-key-123"
PROMPTS = ["the quick brown fox", "a b c d", "hello world of the", "the and is of"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft):
    port = _free_port()
    cmd = [sys.executable, "-m", "llama_dflash.cli", "serve", "--model", tiny_target, "--draft-model", tiny_draft,
           "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY, "--n-ctx", "256", "--n-batch", "64",
           "--n-threads", "1", "--draft-n-max", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError(proc.stdout.read().decode(errors="replace"))
            try:
                if requests.get(base + "/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        else:
            raise RuntimeError("server did not start")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def reference(tiny_target):
    llm = Llama(tiny_target, logits_all=True, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1,
                flash_attn=True)  # as `serve` runs by default
    yield llm
    llm.close()


def _post(base, path, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(base + path, json=body, headers=headers, timeout=60, **kw)


def test_api_key_refused(server):
    body = {"prompt": "a", "max_tokens": 2}
    assert _post(server, "/v1/completions", body, key=None).status_code == 401
    assert _post(server, "/v1/completions", body, key="wrong").status_code == 401
    assert _post(server, "/v1/completions", body).status_code == 200


def test_completion_and_chat_match_ordinary(server, reference):
    r = _post(server, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    data = r.json()
    ref = reference.create_completion(PROMPTS[0], max_tokens=24, temperature=0)
    assert data["choices"][0]["text"] == ref["choices"][0]["text"]
    spec = data["speculative"]
    assert spec["algorithm"] == "auto,draft-dflash" and spec["generated_tokens"] >= 1 and "acceptance_rate" in spec
    messages = [{"role": "user", "content": "hi there"}]
    r = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    ref = reference.create_chat_completion(messages, max_tokens=16, temperature=0)
    assert r.json()["choices"][0]["message"] == ref["choices"][0]["message"]


def _sse(resp) -> list[dict]:
    events = []
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            payload = line[6:]
            if payload == b"[DONE]":
                events.append("DONE")
            else:
                events.append(json.loads(payload))
    return events


def test_streaming(server, reference):
    body = {"prompt": PROMPTS[2], "max_tokens": 20, "temperature": 0, "stream": True}
    with _post(server, "/v1/completions", body, stream=True) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse(r)
    assert events[-1] == "DONE"
    chunks = events[:-1]
    ref = reference.create_completion(PROMPTS[2], max_tokens=20, temperature=0)["choices"][0]["text"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == ref
    assert "speculative" in chunks[-1]
    messages = [{"role": "user", "content": "hello"}]
    with _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 12, "temperature": 0,
                                                 "stream": True}, stream=True) as r:
        events = _sse(r)
    ref = reference.create_chat_completion(messages, max_tokens=12, temperature=0)["choices"][0]["message"]["content"]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == ref


def test_concurrent_clients(server, reference):
    expected = {p: reference.create_completion(p, max_tokens=16, temperature=0)["choices"][0]["text"] for p in PROMPTS}

    def one(i):
        p = PROMPTS[i % len(PROMPTS)]
        if i % 2:
            with _post(server, "/v1/completions", {"prompt": p, "max_tokens": 16, "temperature": 0, "stream": True},
                       stream=True) as r:
                text = "".join(c["choices"][0]["text"] for c in _sse(r)[:-1])
        else:
            text = _post(server, "/v1/completions", {"prompt": p, "max_tokens": 16, "temperature": 0}).json()[
                "choices"][0]["text"]
        return p, text

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for p, text in results:
        assert text == expected[p]


def test_early_closed_stream_then_correct(server, reference):
    body = {"prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0.8, "stream": True}
    with _post(server, "/v1/completions", body, stream=True) as r:
        next(r.iter_lines())
    ref = reference.create_completion(PROMPTS[3], max_tokens=16, temperature=0)["choices"][0]["text"]
    r = _post(server, "/v1/completions", {"prompt": PROMPTS[3], "max_tokens": 16, "temperature": 0})
    assert r.json()["choices"][0]["text"] == ref


def test_metrics(server):
    _post(server, "/v1/completions", {"prompt": "a b", "max_tokens": 4, "temperature": 0})
    assert requests.get(server + "/metrics", timeout=10).status_code == 401  # the key is needed here too
    r = requests.get(server + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    values = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    for name in ("acceptance_rate", "accepted_per_step", "mean_accepted_length", "tokens_per_second", "rollbacks_total",
                 "requests_total", "generated_tokens_total"):
        assert f"llama_dflash_{name}" in values
    assert values["llama_dflash_requests_total"] >= 1
    assert values["llama_dflash_generated_tokens_total"] >= 4
    assert values["llama_dflash_tokens_per_second"] > 0


def test_bad_requests(server):
    assert _post(server, "/v1/chat/completions", {"messages": []}).status_code == 400
    assert _post(server, "/v1/completions", {"prompt": "a " * 400, "max_tokens": 2}).status_code == 400  # > n_ctx


def test_metrics_label_ordinary(tiny_target):
    from llama_dflash.server.app import create_app
    from starlette.testclient import TestClient

    llm = Llama(tiny_target, logits_all=True, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    try:
        client = TestClient(create_app(llm))
        r = client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["speculative"]["algorithm"] == "ordinary"
        # every token of an ordinary answer is the target's own: tau 1.0, not 0.0
        assert r.json()["speculative"]["tau"] == r.json()["speculative"]["mean_accepted_length"] == 1.0
        metrics = client.get("/metrics").text
        assert 'algorithm="ordinary"' in metrics
        assert 'llama_dflash_tokens_per_step{algorithm="ordinary"} 1.0' in metrics
    finally:
        llm.close()


def test_logprobs_through_http(server, reference):
    body = {"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0, "logprobs": 3}
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]["logprobs"]
    ref = reference.create_completion(PROMPTS[1], max_tokens=8, temperature=0, logprobs=3)["choices"][0]["logprobs"]
    assert got["tokens"] == ref["tokens"] and got["text_offset"] == ref["text_offset"]
    for a, b in zip(got["token_logprobs"], ref["token_logprobs"]):
        assert abs(a - float(b)) < 1e-3
    assert [sorted(d) for d in got["top_logprobs"]] == [sorted(d) for d in ref["top_logprobs"]]
    with _post(server, "/v1/completions", dict(body, stream=True), stream=True) as r:
        events = [e for e in _sse(r) if e != "DONE"]
    assert all("error" not in e for e in events)
    streamed = [t for e in events for t in (e["choices"][0].get("logprobs") or {}).get("tokens", [])]
    assert streamed == ref["tokens"]
    messages = [{"role": "user", "content": "hi there"}]
    r = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0,
                                               "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) >= 1 and all(len(c["top_logprobs"]) == 2 for c in content)


def test_grammar_through_http(server, reference):
    import llama_cpp

    gbnf = 'root ::= ("the" | "a" | "dog") (" " ("the" | "a" | "dog"))*'
    body = {"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0, "grammar": gbnf}
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    ref = reference.create_completion(PROMPTS[0], max_tokens=10, temperature=0,
                                      grammar=llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False))
    text = r.json()["choices"][0]["text"]
    assert text == ref["choices"][0]["text"]
    assert set(text.split()[:-1]) <= {"the", "a", "dog"}  # the last word may be cut by max_tokens
    assert _post(server, "/v1/completions", dict(body, grammar=5)).status_code == 400
    assert _post(server, "/v1/completions", dict(body, grammar="root ::= (")).status_code == 400
