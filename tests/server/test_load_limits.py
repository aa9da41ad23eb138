"""Deadlines, queue limit, late stream errors and a close that waits for the running step (issue 13,
item 6), against a scripted model whose every token takes a known time."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from llama_dflash.server.app import create_app  # noqa: E402


class SlowModel:
    """Stands in for `highlevel.Llama`: completions built, like llama-cpp-python's, on `generate()`."""

    model_path = "/private/dir/slow.gguf"

    def __init__(self, step: float = 0.01, fail_after: int | None = None):
        self.step = step
        self.fail_after = fail_after
        self.busy = False
        self.closed = False
        self.close_saw_busy: bool | None = None
        self.started = threading.Event()

    def n_vocab(self) -> int:
        return 50

    def n_ctx(self) -> int:
        return 128

    def generate(self, tokens, **kwargs):
        for i in itertools.count():
            if self.closed:
                raise AssertionError("decode after close")
            self.busy = True
            self.started.set()
            time.sleep(self.step)
            self.busy = False
            if self.fail_after is not None and i == self.fail_after:
                raise RuntimeError("boom")
            yield i % 50

    def create_completion(self, prompt, max_tokens=16, stream=False, **kwargs):
        tokens = self.generate([0])

        def chunks():
            try:
                for n, tok in zip(range(max_tokens), tokens):
                    yield {"choices": [{"text": f"{tok} ", "index": 0, "finish_reason": None}]}
            finally:
                tokens.close()

        if stream:
            return chunks()
        text = "".join(c["choices"][0]["text"] for c in chunks())
        return {"choices": [{"text": text, "index": 0, "finish_reason": "length"}]}

    def close(self) -> None:
        self.close_saw_busy = self.busy
        self.closed = True


def _events(text: str) -> list[tuple[str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        out.append((lines.get("event", "message"), lines.get("data", "")))
    return out


def test_deadline_stops_a_non_streamed_request():
    with TestClient(create_app(SlowModel(), request_timeout=0.5)) as c:
        t0 = time.monotonic()
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1000})
        assert time.monotonic() - t0 < 3.0
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3}).status_code == 200


def test_deadline_ends_a_stream_with_an_error_event():
    with TestClient(create_app(SlowModel(), request_timeout=0.5)) as c:
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1000, "stream": True})
        assert r.status_code == 200
        events = _events(r.text)
        assert events[0][0] == "message" and events[-1][0] == "error"
        assert json.loads(events[-1][1])["error"]["code"] == "timeout"
        assert all(data != "[DONE]" for _, data in events)


def test_error_after_the_stream_started_is_an_sse_error_event():
    with TestClient(create_app(SlowModel(fail_after=3)), raise_server_exceptions=False) as c:
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 10, "stream": True})
        assert r.status_code == 200
        events = _events(r.text)
        assert [e for e, _ in events] == ["message"] * 3 + ["error"]
        err = json.loads(events[-1][1])["error"]
        assert err["type"] == "server_error" and "RuntimeError" in err["message"] and "boom" not in err["message"]
        assert c.get("/health").status_code == 200


def test_queue_limit_answers_503():
    model = SlowModel(step=0.02)
    with TestClient(create_app(model, max_queue=0)) as c:
        first: dict = {}
        worker = threading.Thread(target=lambda: first.update(
            r=c.post("/v1/completions", json={"prompt": "x", "max_tokens": 50})))
        worker.start()
        assert model.started.wait(10)
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
        worker.join(30)
        assert first["r"].status_code == 200
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


def test_close_waits_for_the_running_step():
    model = SlowModel(step=0.05)
    app = create_app(model)
    with TestClient(app) as c:
        got: dict = {}
        worker = threading.Thread(target=lambda: got.update(
            r=c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1000})))
        worker.start()
        assert model.started.wait(10)
        app.state.runner.close()  # as at shutdown: the running request stops at its next token
        assert model.closed and model.close_saw_busy is False
        worker.join(30)
        assert got["r"].status_code == 503 and got["r"].json()["error"]["code"] == "shutting_down"
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 503
        assert c.get("/health").status_code == 200


def test_stream_to_a_client_that_stops_reading_gives_the_model_back():
    """A send that never completes (full socket buffers) ends the reply after send_timeout."""
    import asyncio

    app = create_app(SlowModel(step=0.001), send_timeout=0.3)
    async def request(send, max_tokens: int) -> None:
        body = json.dumps({"prompt": "x", "max_tokens": max_tokens, "stream": True}).encode()
        delivered = False

        async def receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client is still there, just not reading

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
                 "root_path": "", "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                                              (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        await app(scope, receive, send)

    async def main() -> list[int]:
        sent: list[int] = []

        async def stuck_send(message):
            sent.append(message.get("status", 0))
            if message["type"] == "http.response.body" and len(sent) > 3:
                await asyncio.Event().wait()

        async def quick_send(message):
            sent.append(message.get("status", -1))

        await asyncio.wait_for(request(stuck_send, 2000), 5)  # 2 s of tokens; stuck after 3 chunks
        assert sent[0] == 200 and len(sent) == 4
        await asyncio.sleep(0.2)  # the stream's generator is closed on the model thread, then the model is free
        n = len(sent)
        await asyncio.wait_for(request(quick_send, 3), 5)
        return sent[n:]

    assert asyncio.run(main())[0] == 200
