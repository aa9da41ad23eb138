"""A small FastAPI app: /v1/completions, /v1/chat/completions (streaming or not), /v1/models,
/health and /metrics (Prometheus text format).

Built on FastAPI directly rather than llama_cpp.server's app: that app loads its own
`llama_cpp.Llama` from settings and validates responses against its TypedDicts, which would drop
our per-response `speculative` statistics.  Request bodies are validated by the pydantic models
in `schemas` and passed to `Llama.create_completion` / `create_chat_completion` with the OpenAI
field names (and llama-cpp-python's extensions: top_k, min_p, repeat_penalty, grammar).

Robustness: `guard.RequestGuard` checks Host, API key, Content-Type and body size; every error
is an OpenAI-style JSON body with a 4xx status (a 5xx only for overload, shutdown or a bug);
`runner.ModelRunner` serves one request at a time with a queue limit, per-request deadline and
cancellation; a stream is a pure ASGI reply that reports a late error as an SSE `error` event,
gives up on a client that stops reading, and closes its generator when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Callable, Collection, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import APIError, error_body
from .guard import RequestGuard
from .batched import batchable
from .runner import Job, ModelRunner
from .schemas import ChatRequest, CompletionRequest, Limits, parse_json, validate_request
from .structured import prepare
from .timings import timings, usage
from .watch import Watch

__all__ = ["create_app", "Metrics", "DEFAULT_MAX_TOKENS_CAP"]

DEFAULT_MAX_TOKENS_CAP = 2048
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _json_default(obj: Any) -> Any:
    """numpy scalars (llama_cpp's logprobs are float32) as plain numbers."""
    item = getattr(obj, "item", None)
    if item is not None:
        return item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _finite(obj: Any) -> Any:
    """`obj` with non-finite floats (a -inf logprob) as null: JSON has no NaN or Infinity."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    obj = _json_default(obj) if hasattr(obj, "item") else obj
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def _dumps(obj: Any) -> str:
    try:
        return json.dumps(obj, default=_json_default, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False)


def _json_response(obj: Any, status: int = 200) -> Response:
    return Response(_dumps(obj), status_code=status, media_type="application/json")


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

    def render(self, algorithm: str, extra: Collection[tuple[str, str, str, float]] = ()) -> str:
        """The counters (and `extra` rows: name, kind, help, value) in Prometheus text format."""
        with self._lock:
            acc = self.accepted / self.verified if self.verified else 0.0
            mal = self.accepted / self.verification_steps if self.verification_steps else 0.0
            tps = self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0
            # tau: ordinary answers (no step counted, every token the target's) are 1.0, not 0.0
            tau = 1.0 + mal if self.verification_steps else 1.0 if self.generated_tokens else 0.0
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
                ("accepted_per_step", "gauge", "Accepted draft tokens per verification step", mal),
                ("mean_accepted_length", "gauge",
                 "tau (llama-cpp-python's name): the target's token plus the mean accepted draft prefix",
                 tau),
                ("tokens_per_step", "gauge",
                 "tau: tokens per verification step (accepted drafts + the target's token)",
                 tau),
                ("tokens_per_second", "gauge", "Generated tokens per generation second", tps),
                *extra,
            ]
        out = []
        for name, kind, help_text, value in rows:
            full = f"llama_dflash_{name}"
            out.append(f"# HELP {full} {help_text}")
            out.append(f"# TYPE {full} {kind}")
            out.append(f'{full}{{algorithm="{algorithm}"}} {value}')
        return "\n".join(out) + "\n"


def _build_info() -> str:
    import llama_cpp

    from .. import __version__

    return f"llama-dflash {__version__} (llama-cpp-python {llama_cpp.__version__})"


#: the page loads nothing from elsewhere: its own inline script and style, requests to this server
PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
            "img-src data:; base-uri 'none'; form-action 'none'")


def chat_page() -> bytes:
    """The chat page (`page.html`, package data: no build step, no external assets)."""
    from importlib.resources import files

    return files(__package__).joinpath("page.html").read_bytes()


def _as_api_error(exc: BaseException) -> Optional[APIError]:
    """The client-facing error for what a completion raised; None for a bug (a 500)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValueError):  # prompt too long, grammar llama.cpp cannot parse, mirostat, ...
        return APIError(400, str(exc)[:1000], code="invalid_request")
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - llama-cpp-python depends on jinja2
        TemplateError = ()  # type: ignore[assignment,misc]
    if TemplateError and isinstance(exc, TemplateError):  # the chat template refused the messages
        return APIError(400, f"the chat template refused the messages: {exc}"[:1000], param="messages",
                        code="invalid_messages")
    return None


async def _wait_disconnect(receive: Callable[[], Any], job: Job) -> None:
    """Mark `job` cancelled when the client goes away (the body has been read already)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            job.cancelled.set()
            return


class EventStream(Response):
    """A server-sent-events reply, sent by its own ASGI `__call__`; owns `job` (the model) until it ends.

    The first chunk was produced before this reply was created, so errors in the request are a
    4xx; a later error is sent as an `error` event and the stream ends (no `[DONE]`).  A send
    that blocks longer than `send_timeout` (a client that stopped reading) ends the reply."""

    def __init__(self, runner: ModelRunner, job: Job, first: Any, encode: Callable[[Any], bytes],
                 on_error: Callable[[], None], send_timeout: float):
        super().__init__(status_code=200, media_type="text/event-stream")
        self.runner = runner
        self.job = job
        self.first = first
        self.encode = encode
        self.on_error = on_error
        self.send_timeout = send_timeout

    async def _send(self, send: Callable[[dict], Any], message: dict[str, Any]) -> None:
        timeout = max(0.5, min(self.send_timeout, self.job.remaining() + 1.0))
        await asyncio.wait_for(send(message), timeout)

    async def _body(self, send: Callable[[dict], Any], data: bytes) -> None:
        await self._send(send, {"type": "http.response.body", "body": data, "more_body": True})

    async def __call__(self, scope: dict, receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
        watcher = asyncio.create_task(_wait_disconnect(receive, self.job))
        try:
            await self._send(send, {"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]})
            chunk = self.first
            failed = False
            while chunk is not None:
                await self._body(send, self.encode(chunk))
                try:
                    chunk = await self.runner.next_chunk(self.job)
                except Exception as exc:  # noqa: BLE001 - reported in-band: the status line is gone
                    failed = True
                    self.on_error()
                    err = _as_api_error(exc) or APIError(500, f"internal error ({type(exc).__name__})")
                    if not self.job.cancelled.is_set():
                        await self._body(send, f"event: error\ndata: {_dumps(err.body())}\n\n".encode())
                    break
            if not failed:
                await self._body(send, b"data: [DONE]\n\n")
            await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
        except (asyncio.TimeoutError, OSError):
            self.job.cancelled.set()  # the client stopped reading or is gone: the server drops the reply
        finally:
            watcher.cancel()
            self.runner.release(self.job)


def create_app(llm: Any, *, api_key: Optional[str] = None, model_alias: Optional[str] = None,
               allowed_hosts: Optional[Collection[str]] = None, max_body_bytes: int = 1 << 20,
               max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP, max_queue: int = 16,
               request_timeout: float = 300.0, send_timeout: float = 30.0,
               close_model_on_shutdown: bool = False, engine: Any = None) -> FastAPI:
    """The app serving one `llama_dflash.highlevel.Llama` (anything with its methods works).

    `allowed_hosts`: Host header values accepted (None: any; see `guard.loopback_hosts`);
    `max_tokens_cap`: the largest max_tokens a request may ask (also the chat default);
    `max_queue`: requests that may wait while one runs (more get 503); `request_timeout`: seconds
    from arrival to the end of the reply; `send_timeout`: seconds a stream waits on a slow client.
    `close_model_on_shutdown`: close `llm` when the app shuts down, after the step in progress
    (`app.state.runner.close()` does the same for a caller that owns the model).
    `engine`: a `llama_dflash.batched.BatchedEngine` on `llm`'s model (`--parallel N`): requests it
    can serve are decoded together on it (`server.batched`), the others (grammar, logprobs,
    logit_bias) one at a time on `llm`; `max_queue` requests may then wait while the engine's slots
    run.  The app closes the engine when it closes the model, or with `app.state.batched.close()`."""
    if max_tokens_cap < 1:
        raise ValueError("max_tokens_cap must be >= 1")
    if api_key is not None and not api_key.strip():
        raise ValueError("the API key must not be empty")
    runner = ModelRunner(llm, max_queue=max_queue, request_timeout=request_timeout)
    batched = None
    if engine is not None:
        from .batched import BatchedRunner

        batched = BatchedRunner(llm, engine, max_queue=max_queue, request_timeout=request_timeout)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        runner.begin_shutdown()
        if batched is not None:
            batched.begin_shutdown()
        if close_model_on_shutdown:
            if batched is not None:  # the engine borrows the model: it goes first
                await asyncio.to_thread(batched.close)
            await asyncio.to_thread(runner.close)

    app = FastAPI(title="llama-dflash", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    metrics = Metrics()
    single_engine = getattr(llm, "engine", None)
    speculator = getattr(llm, "speculator", None)
    algorithm = "ordinary" if getattr(llm, "speculative", None) is None else \
        getattr(single_engine, "algorithm", None) or getattr(getattr(speculator, "stats", None), "algorithm", "dflash")
    if batched is not None:
        algorithm = batched.engine.algorithm
    model_id = model_alias or Path(str(getattr(llm, "model_path", "model"))).name
    limits = Limits(n_vocab=int(llm.n_vocab()), max_tokens_cap=max_tokens_cap, n_ctx=int(llm.n_ctx()))
    app.state.metrics = metrics
    app.state.llm = llm
    app.state.runner = runner
    app.state.batched = batched
    # the chat page is static (no data of the server's): open like /health; its requests carry the key
    app.add_middleware(RequestGuard, api_key=api_key, allowed_hosts=allowed_hosts, max_body_bytes=max_body_bytes,
                       open_paths=("/health", "/"))

    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError):
        return _json_response(exc.body(), exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException):
        return _json_response(error_body(exc.status_code, str(exc.detail)), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError):
        return _json_response(error_body(400, "invalid request: " + "; ".join(e.get("msg", "") for e in exc.errors())),
                              400)

    @app.exception_handler(Exception)
    async def bug(_request: Request, exc: Exception):  # the traceback goes to the server's log
        return _json_response(error_body(500, f"internal server error ({type(exc).__name__})"), 500)

    def encoder(include_usage: bool) -> Callable[[dict[str, Any]], bytes]:
        """SSE bytes of one chunk; the chunk with the finish reason gets `timings` and, with
        `include_usage`, is followed by OpenAI's usage chunk (no choices)."""
        def encode(chunk: dict[str, Any]) -> bytes:
            chunk["model"] = model_id
            tail = b""
            spec = chunk.get("speculative")
            if spec is not None:
                metrics.record(spec)
                chunk["timings"] = timings(spec)
                if include_usage:
                    last = {"id": chunk.get("id"), "object": chunk.get("object"), "created": chunk.get("created"),
                            "model": model_id, "choices": [], "usage": usage(spec)}
                    tail = f"data: {_dumps(last)}\n\n".encode()
            if include_usage:
                chunk.setdefault("usage", None)
            return f"data: {_dumps(chunk)}\n\n".encode() + tail

        return encode

    vocab = getattr(getattr(llm, "_model", None), "vocab", None)

    async def serve(request: Request, schema: type, fn: Callable[..., Any], default_max_tokens: int):
        req = validate_request(schema, parse_json(await request.body()), limits)
        prepared = prepare(req, req.to_kwargs(default_max_tokens), vocab)
        kwargs = prepared.kwargs
        fn_, post = fn, prepared.post
        use = runner
        if req.token_origins or not req.speculative:
            # our extensions: served one at a time on `llm` (the batch has no per-token origins)
            fn_, post = Watch(llm, record=req.token_origins, drafting=req.speculative).wrap(fn, post)
        elif batched is not None and batchable(kwargs) is None:
            use = batched
        job = await use.acquire(generate_nothing=kwargs["max_tokens"] == 0)
        handed_over = False
        try:
            if await request.is_disconnected():  # gone while waiting in the queue: nothing to do
                return Response(status_code=499)
            if req.stream:
                first = await use.start_stream(job, fn_, kwargs, post)
                handed_over = True
                return EventStream(use, job, first, encoder(req.include_usage), metrics.error, send_timeout)
            watcher = asyncio.create_task(_wait_disconnect(request.receive, job))
            try:
                result = await use.call(job, fn_, kwargs, post)
            finally:
                watcher.cancel()
        except Exception as exc:
            metrics.error()
            err = _as_api_error(exc)
            if err is None:
                raise
            raise err from None
        finally:
            if not handed_over:
                use.release(job)
        spec = result.get("speculative", {})
        metrics.record(spec)
        result["model"] = model_id
        result["timings"] = timings(spec)
        return _json_response(result)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, CompletionRequest, llm.create_completion,
                           min(COMPLETION_DEFAULT_MAX_TOKENS, max_tokens_cap))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await serve(request, ChatRequest, llm.create_chat_completion, max_tokens_cap)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "owned_by": "llama-dflash",
                                             "created": int(time.time())}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    page = chat_page()

    @app.get("/")
    async def index():
        """A small chat page that streams answers with each token marked by its origin."""
        return Response(page, media_type="text/html; charset=utf-8",
                        headers={"cache-control": "no-cache", "content-security-policy": PAGE_CSP})

    n_slots = batched.engine.n_seq if batched is not None else 1
    slot_ctx = int(batched.engine.n_ctx_seq) if batched is not None else int(llm.n_ctx())
    speculative = algorithm != "ordinary"

    @app.get("/props")
    async def props():
        """llama-server's /props, the parts this server can answer truthfully."""
        return {
            "default_generation_settings": {"n_ctx": slot_ctx, "speculative": speculative,
                                            "max_tokens_cap": max_tokens_cap},
            "total_slots": n_slots, "model_alias": model_id, "model_path": str(getattr(llm, "model_path", "")),
            "chat_template": (getattr(llm, "metadata", None) or {}).get("tokenizer.chat_template"),
            "chat_format": getattr(llm, "chat_format", None),
            "modalities": {"vision": False, "audio": False},
            "speculative": {"algorithm": algorithm}, "build_info": _build_info(),
        }

    @app.get("/slots")
    async def slots():
        """llama-server's /slots: one entry per slot, and whether a request holds it now."""
        if batched is not None:
            busy = set(batched.engine.busy_slots())
        else:
            busy = {0} if runner.admitted > 0 else set()
        return [{"id": i, "n_ctx": slot_ctx, "speculative": speculative, "is_processing": i in busy}
                for i in range(n_slots)]

    @app.get("/metrics")
    async def prom():
        return PlainTextResponse(metrics.render(algorithm, batch_rows()), media_type="text/plain; version=0.0.4")

    def batch_rows() -> list[tuple[str, str, str, float]]:
        if batched is None:
            return []
        st = batched.engine.stats()
        return [
            ("batch_slots", "gauge", "Sequences the batched engine decodes together (--parallel)", st["n_seq"]),
            ("batch_active_sequences", "gauge", "Sequences in the engine's slots now (batch occupancy)",
             st["active"]),
            ("batch_occupancy", "gauge", "Active sequences / slots now", st["active"] / st["n_seq"]),
            ("queue_length", "gauge", "Requests waiting for a slot", st["waiting"]),
            ("batch_steps_total", "counter", "Decodes of the batched engine", st["steps"]),
            ("batch_rows_total", "counter", "Rows those decodes carried", st["rows_decoded"]),
            ("batch_mean_sequences", "gauge", "Mean sequences per decode (occupancy over the run)",
             st["mean_batch_sequences"]),
            ("batch_prompt_tokens_total", "counter", "Prompt tokens of the requests the engine admitted",
             st["prompt_tokens"]),
            ("batch_cached_prompt_tokens_total", "counter",
             "Prompt tokens a slot's cells already held (prefix reuse: not decoded again)", st["cached_tokens"]),
            ("batch_restored_prompt_tokens_total", "counter",
             "Of those, prompt tokens restored from the host prompt cache (--cache-ram)", st["restored_tokens"]),
            ("prompt_cache_bytes", "gauge", "Host memory the saved slot states take", st["prompt_cache_bytes"]),
            ("batch_step_seconds_total", "counter", "Seconds the engine thread spent in steps (busy time)",
             st["step_seconds"]),
            ("batch_decode_seconds_total", "counter", "Of those, seconds in the steps' target decodes",
             st["decode_seconds"]),
            ("batch_prefill_seconds_total", "counter", "Of those, seconds prefilling admitted prompts",
             st["prefill_seconds"]),
        ]

    return app
