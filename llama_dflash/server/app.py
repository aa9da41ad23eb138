"""A small FastAPI app: /v1/completions, /v1/chat/completions (streaming or not), /v1/models,
/health and /metrics (Prometheus text format).

Built on FastAPI directly rather than llama_cpp.server's app: that app loads its own
`llama_cpp.Llama` from settings and validates responses against its TypedDicts, which would drop
our per-response `speculative` statistics.  Request bodies are passed to
`Llama.create_completion` / `create_chat_completion` with the same field names as the OpenAI API
(and llama-cpp-python's extensions: top_k, min_p, repeat_penalty, seed).  One model, one lock:
requests are served one at a time (an asyncio lock), streams hold it until they end
or the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from typing import Any, AsyncIterator, Iterator, Optional

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

__all__ = ["create_app", "Metrics"]

_COMMON = ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "max_tokens", "presence_penalty",
           "frequency_penalty", "repeat_penalty", "logit_bias", "grammar")
_COMPLETION = _COMMON + ("suffix", "echo", "logprobs")
_CHAT = _COMMON + ("logprobs", "top_logprobs")



def _json_default(obj: Any) -> Any:
    """numpy scalars (llama_cpp's logprobs are float32) as plain numbers."""
    item = getattr(obj, "item", None)
    if item is not None:
        return item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default)

class Metrics:
    """Counters over all requests served, rendered in Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.errors = 0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.drafted = 0
        self.verified = 0
        self.accepted = 0
        self.verification_steps = 0
        self.rollbacks = 0
        self.decode_seconds = 0.0

    def record(self, s: dict[str, Any]) -> None:
        with self._lock:
            self.requests += 1
            for k in ("generated_tokens", "prompt_tokens", "drafted", "verified", "accepted",
                      "verification_steps", "rollbacks"):
                setattr(self, k, getattr(self, k) + int(s.get(k, 0)))
            self.decode_seconds += float(s.get("total_seconds", 0.0))

    def error(self) -> None:
        with self._lock:
            self.errors += 1

    def render(self, algorithm: str) -> str:
        with self._lock:
            acc = self.accepted / self.verified if self.verified else 0.0
            mal = self.accepted / self.verification_steps if self.verification_steps else 0.0
            tps = self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0
            rows = [
                ("requests_total", "counter", "Completed generation requests", self.requests),
                ("request_errors_total", "counter", "Requests that failed", self.errors),
                ("generated_tokens_total", "counter", "Tokens generated", self.generated_tokens),
                ("prompt_tokens_total", "counter", "Prompt tokens processed", self.prompt_tokens),
                ("drafted_tokens_total", "counter", "Draft tokens proposed", self.drafted),
                ("verified_tokens_total", "counter", "Draft tokens verified by the target", self.verified),
                ("accepted_tokens_total", "counter", "Draft tokens accepted", self.accepted),
                ("verification_steps_total", "counter", "Target verification decodes", self.verification_steps),
                ("rollbacks_total", "counter", "Steps that rejected part of the draft", self.rollbacks),
                ("decode_seconds_total", "counter", "Seconds spent generating", self.decode_seconds),
                ("acceptance_rate", "gauge", "Accepted / verified draft tokens", acc),
                ("mean_accepted_length", "gauge", "Accepted draft tokens per verification step", mal),
                ("tokens_per_second", "gauge", "Generated tokens per generation second", tps),
            ]
        out = []
        for name, kind, help_text, value in rows:
            full = f"llama_dflash_{name}"
            out.append(f"# HELP {full} {help_text}")
            out.append(f"# TYPE {full} {kind}")
            out.append(f'{full}{{algorithm="{algorithm}"}} {value}')
        return "\n".join(out) + "\n"


def _pick(body: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    kw = {k: body[k] for k in names if k in body and body[k] is not None}
    if "logit_bias" in kw:
        kw["logit_bias"] = {int(k): float(v) for k, v in kw["logit_bias"].items()}
    if "grammar" in kw:  # GBNF text, as llama-cpp-python's server takes it
        if not isinstance(kw["grammar"], str) or not kw["grammar"].strip():
            raise HTTPException(status_code=400, detail="grammar must be a GBNF string")
        from llama_cpp import LlamaGrammar

        kw["grammar"] = LlamaGrammar.from_string(kw["grammar"], verbose=False)
    return kw


def create_app(llm: Any, *, api_key: Optional[str] = None, model_alias: Optional[str] = None) -> FastAPI:
    """The app serving one `llama_dflash.highlevel.Llama` (anything with its methods works)."""
    app = FastAPI(title="llama-dflash")
    # one model, one request at a time; waiting happens in the event loop, not in worker threads
    # (blocked workers would starve the thread pool the lock holder needs)
    locks: dict[int, asyncio.Lock] = {}

    def get_lock() -> asyncio.Lock:
        return locks.setdefault(id(asyncio.get_running_loop()), asyncio.Lock())

    metrics = Metrics()
    engine = getattr(llm, "engine", None)
    algorithm = "ordinary" if getattr(llm, "speculative", None) is None else getattr(engine, "algorithm", "dflash")
    model_id = model_alias or getattr(llm, "model_path", "model")
    app.state.metrics = metrics
    app.state.llm = llm

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1/"):
            auth = request.headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
            if not secrets.compare_digest(given.encode(), api_key.encode()):
                return JSONResponse({"error": {"message": "invalid API key", "type": "invalid_request_error"}},
                                    status_code=401)
        return await call_next(request)

    def run_blocking(fn, kwargs):
        try:
            result = fn(**kwargs)
        except Exception:
            metrics.error()
            raise
        metrics.record(result.get("speculative", {}))
        result["model"] = model_id
        return result

    def produce(fn, kwargs) -> Iterator[bytes]:
        chunks = fn(**kwargs)
        try:
            for chunk in chunks:
                chunk["model"] = model_id
                if "speculative" in chunk:
                    metrics.record(chunk["speculative"])
                yield f"data: {_dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001 - report in-band, the status line is gone
            metrics.error()
            yield f"data: {json.dumps({'error': {'message': str(exc)}})}\n\n".encode()
        finally:
            chunks.close()

    async def stream_locked(fn, kwargs) -> AsyncIterator[bytes]:
        """Drive the (blocking) stream in worker threads; the model lock is held from the first
        chunk until the stream is finished or the client is gone.  Cleanup runs in a thread: it
        waits for a step still running, closes the generator (rewinding the caches) and unlocks."""
        lock = get_lock()
        await lock.acquire()
        loop = asyncio.get_running_loop()
        state: dict[str, Any] = {"it": None}
        step_lock = threading.Lock()

        def step() -> Optional[bytes]:
            with step_lock:
                if state["it"] is None:
                    state["it"] = produce(fn, kwargs)
                return next(state["it"], None)

        def cleanup() -> None:
            try:
                with step_lock:
                    if state["it"] is not None:
                        state["it"].close()
            finally:
                loop.call_soon_threadsafe(lock.release)

        try:
            while True:
                item = await asyncio.to_thread(step)
                if item is None:
                    break
                yield item
        finally:
            threading.Thread(target=cleanup, name="llama-dflash-stream-cleanup", daemon=True).start()

    async def serve(fn, kwargs, stream: bool):
        if stream:
            return StreamingResponse(stream_locked(fn, kwargs), media_type="text/event-stream")
        try:
            lock = get_lock()
            await lock.acquire()
            # the lock is released when the work is done, even if this request is cancelled
            future = asyncio.get_running_loop().run_in_executor(None, run_blocking, fn, kwargs)
            future.add_done_callback(lambda _f: lock.release())
            result = await asyncio.shield(future)
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        return Response(_dumps(result), media_type="application/json")

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as exc:
            raise HTTPException(status_code=400, detail="the body must be JSON") from exc
        if not isinstance(body, dict):
            raise HTTPException(status_code=400, detail="the body must be a JSON object")
        return body

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request)
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise HTTPException(status_code=400, detail="one prompt per request")
            prompt = prompt[0]
        kwargs = _pick(body, _COMPLETION)
        stream = bool(body.get("stream", False))
        kwargs.update(prompt=prompt, stream=stream)
        return await serve(llm.create_completion, kwargs, stream)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await body_of(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(status_code=400, detail="messages must be a non-empty list")
        kwargs = _pick(body, _CHAT)
        stream = bool(body.get("stream", False))
        kwargs.update(messages=messages, stream=stream)
        return await serve(llm.create_chat_completion, kwargs, stream)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "owned_by": "me",
                                             "created": int(time.time())}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def prom():
        return PlainTextResponse(metrics.render(algorithm), media_type="text/plain; version=0.0.4")

    return app
