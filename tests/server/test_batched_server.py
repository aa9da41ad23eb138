"""`llama-dflash serve --parallel N` (issue 30): requests decoded together by the batched engine give
the answers they get one at a time; options the engine cannot honour go to the one-at-a-time path;
/metrics shows the batch; the queue limit, deadlines and shutdown still hold."""

from __future__ import annotations

import argparse
import json
import threading

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from llama_dflash.config import SpecConfig  # noqa: E402
from llama_dflash.highlevel import Llama  # noqa: E402
from llama_dflash.server.app import create_app  # noqa: E402
from llama_dflash.server.batched import batchable  # noqa: E402
from llama_dflash.server.cli import batched_engine  # noqa: E402

BODIES = [
    ("/v1/completions", {"prompt": "the quick brown fox", "max_tokens": 24, "temperature": 0}),
    ("/v1/completions", {"prompt": "a b c d a b c d a b", "max_tokens": 24, "temperature": 0, "stop": ["d a"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello world of the"}], "max_tokens": 24,
                              "temperature": 0}),
    ("/v1/completions", {"prompt": "the and is of", "max_tokens": 24, "temperature": 0.8, "seed": 42}),
    ("/v1/completions", {"prompt": "once upon a time", "max_tokens": 24, "temperature": 0, "echo": True}),
]


def _app(path, parallel=4, spec=None, **kw):
    llm = Llama(path, speculative=spec, logits_all=True, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1,
                flash_attn=True, verbose=False)
    engine = batched_engine(llm, argparse.Namespace(parallel=parallel, n_ctx=256, n_batch=64, flash_attn="on"),
                            spec, 1)
    return create_app(llm, engine=engine, close_model_on_shutdown=True, **kw)


def _text(body):
    choice = body["choices"][0]
    return (choice.get("text") if "text" in choice else choice["message"]["content"]), choice["finish_reason"]


def _stream_text(resp):
    text, finish = "", None
    for line in resp.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            choice = json.loads(line[6:])["choices"][0]
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
    assert resp.text.rstrip().endswith("data: [DONE]")
    return text, finish


@pytest.fixture(scope="module")
def single_answers(tiny_target):
    """The answers of `llama-dflash serve` as it was (--parallel 1)."""
    llm = Llama(tiny_target, logits_all=True, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, flash_attn=True,
                verbose=False)
    app = create_app(llm, close_model_on_shutdown=True)
    with TestClient(app) as client:
        plain = [_text(client.post(p, json=b).json()) for p, b in BODIES]
        streamed = [_stream_text(client.post(p, json=dict(b, stream=True))) for p, b in BODIES]
    return plain, streamed


def test_concurrent_answers_equal_the_one_at_a_time_server(tiny_target, single_answers):
    single_answers, single_streamed = single_answers
    assert len(set(single_answers)) == len(BODIES)
    with TestClient(_app(tiny_target)) as client:
        got: dict[tuple[int, bool], tuple] = {}

        def ask(i: int, stream: bool) -> None:
            path, body = BODIES[i]
            resp = client.post(path, json=dict(body, stream=stream))
            assert resp.status_code == 200, resp.text
            got[(i, stream)] = _stream_text(resp) if stream else _text(resp.json())

        threads = [threading.Thread(target=ask, args=(i, s)) for s in (False, True) for i in range(len(BODIES))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i, ref in enumerate(single_answers):
            assert got[(i, False)] == ref, BODIES[i]
        # streamed: as the one-at-a-time server streams them (llama-cpp-python's streaming drops a
        # multi-byte character split across tokens, so a stream may differ from the plain answer)
        assert [got[(i, True)] for i in range(len(BODIES))] == single_streamed
        metrics = client.get("/metrics").text
        occupancy = [line for line in metrics.splitlines() if line.startswith("llama_dflash_batch_mean_sequences")]
        assert occupancy and float(occupancy[0].rsplit(" ", 1)[1]) > 1.0  # requests really shared decodes
        assert 'llama_dflash_batch_slots{algorithm="ordinary"} 4' in metrics
        assert "llama_dflash_queue_length" in metrics


def test_per_request_speculative_stats_with_lookup(tiny_target):
    spec = SpecConfig(spec_type="lookup", draft_n_max=4)
    with TestClient(_app(tiny_target, spec=spec)) as client:
        body = client.post("/v1/completions", json={"prompt": "a b c d a b c d a b c d a b", "max_tokens": 24,
                                                     "temperature": 0}).json()
        stats = body["speculative"]
        assert stats["algorithm"] == "lookup" and stats["generated_tokens"] == body["usage"]["completion_tokens"]
        assert stats["prompt_tokens"] == body["usage"]["prompt_tokens"]
        assert stats["drafted"] > 0 and 0 <= stats["accepted"] <= stats["verified"]
        assert "llama_dflash_drafted_tokens_total" in client.get("/metrics").text


def test_options_the_engine_cannot_honour_go_to_the_single_path(tiny_target, single_answers):
    single_answers = single_answers[0]
    assert batchable({"grammar": object()}) == "grammar" and batchable({"logprobs": 2}) == "logprobs"
    assert batchable({"logprobs": False, "max_tokens": 3}) is None and batchable({"logit_bias": {1: 2.0}})
    with TestClient(_app(tiny_target)) as client:
        g = client.post("/v1/completions", json={"prompt": "the", "max_tokens": 8, "temperature": 0,
                                                  "grammar": 'root ::= "yes" | "no"'})
        assert g.status_code == 200 and _text(g.json())[0] in ("yes", "no")
        lp = client.post("/v1/completions", json={"prompt": "the quick brown fox", "max_tokens": 24,
                                                   "temperature": 0, "logprobs": 2}).json()
        assert _text(lp) == single_answers[0]
        assert len(lp["choices"][0]["logprobs"]["tokens"]) == lp["usage"]["completion_tokens"] > 0
        steps = [line for line in client.get("/metrics").text.splitlines()
                 if line.startswith("llama_dflash_batch_steps_total")]
        assert float(steps[0].rsplit(" ", 1)[1]) == 0  # neither went through the engine


def test_queue_limit_and_deadline(tiny_target):
    app = _app(tiny_target, parallel=1, max_queue=0, request_timeout=0.5)
    with TestClient(app) as client:
        runner = app.state.batched
        engine = runner.engine
        long = {"prompt": "the quick brown fox", "max_tokens": 20, "temperature": 0}
        first: dict = {}
        with engine._step_lock:  # the engine cannot step: the first request holds the only slot, waiting
            t = threading.Thread(target=lambda: first.update(r=client.post("/v1/completions", json=long)))
            t.start()
            for _ in range(500):
                if runner.admitted:
                    break
                threading.Event().wait(0.01)
            busy = client.post("/v1/completions", json=long)
            t.join(30)  # its deadline passes while it waits
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "queue_full"
        r = first["r"]
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
        ok = client.post("/v1/completions", json={"prompt": "the", "max_tokens": 2, "temperature": 0})
        assert ok.status_code == 200  # the slot and the admission were given back
        for _ in range(100):  # the admission is given back by a callback on the worker pool
            if runner.admitted == 0:
                break
            threading.Event().wait(0.01)
        assert engine.n_active == 0 and engine.n_waiting == 0 and runner.admitted == 0


def test_draft_model_answers_equal_the_one_at_a_time_server(tiny_target, tiny_draft, single_answers):
    """With a DFlash draft, requests decoded together (one draft decode for every drafting request)
    get the answers of the ordinary one-at-a-time server, each with its own speculative stats."""
    single_answers = single_answers[0]
    spec = SpecConfig(tiny_draft, draft_n_max=3)
    with TestClient(_app(tiny_target, spec=spec)) as client:
        got: dict[int, tuple] = {}
        stats: dict[int, dict] = {}

        def ask(i: int) -> None:
            path, body = BODIES[i]
            resp = client.post(path, json=body)
            assert resp.status_code == 200, resp.text
            got[i] = _text(resp.json())
            stats[i] = resp.json()["speculative"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(BODIES))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [got[i] for i in range(len(BODIES))] == single_answers
        assert all(st["algorithm"] == "draft-dflash" and st["draft_model_steps"] > 0 for st in stats.values())
        assert 'llama_dflash_batch_slots{algorithm="draft-dflash"} 4' in client.get("/metrics").text


def test_auto_with_parallel_is_refused(tiny_target, tiny_draft):
    from llama_dflash.server.cli import configure, run

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--model", tiny_target, "--draft-model", tiny_draft, "--spec-type", "auto",
                              "--parallel", "2"])
    with pytest.raises(ValueError, match="--parallel 2 does not run --spec-type auto"):
        run(args)


def test_load_script_with_parallel(tiny_target, tmp_path):
    """bench/load.py against `serve --parallel 3`: 4 clients, plain and streamed, early disconnects;
    every answer equals the sequential one, nothing fails."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "load.py"
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--model", tiny_target, "--no-draft", "--parallel", "3", "--clients", "4",
         "--requests", "16", "--duration", "30", "--n-threads", "1", "--n-ctx", "256", "--max-tokens", "24",
         "--disconnect-every", "3", "--json", str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["errors"] == 0 and report["wrong_answers"] == 0, report["failures"]
    assert report["requests_sent"] == 16 and report["disconnected_early"] >= 1
    assert report["completed"] + report["disconnected_early"] == 16
    assert report["health_ok"] and not report["after_problems"] and not report["server_crashed"]
    assert "--parallel" in report["server_args"]
