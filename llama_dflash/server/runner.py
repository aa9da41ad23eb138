"""One model, one request at a time, with a queue limit, deadlines, cancellation and a safe close.

Every call into the model -- a whole non-streamed request, each step of a stream, closing a
stream's generator and closing the model itself -- runs on one dedicated thread, in the order it
was submitted.  So the model is never entered from two threads, and `close()` (shutdown) runs
only after the step in progress has returned: the context is never freed under a running decode.

Requests take the model in turn through an asyncio lock; at most `max_queue` wait while one runs
(more get 503).  Each request has a deadline, counted from its arrival.  A running generation is
stopped between tokens when its deadline passes, its client goes away or the server shuts down:
the model's token generator is wrapped (`llm.generate`, which llama-cpp-python's completion code
calls) so that it raises `RequestStopped` there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional

from .errors import APIError

__all__ = ["ModelRunner", "Job", "RequestStopped"]


class RequestStopped(APIError):
    """A generation stopped before it finished (deadline passed, client gone, server shutting down)."""


class Job:
    """One admitted request: its deadline and cancellation flag, and (streams) its chunk iterator."""

    def __init__(self, runner: "ModelRunner", deadline: float, generate_nothing: bool = False):
        self.runner = runner
        self.deadline = deadline
        self.generate_nothing = generate_nothing  # max_tokens=0: llama-cpp-python reads 0 as "no limit"
        self.cancelled = threading.Event()
        self.chunks: Optional[Iterator[Any]] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._lock: Optional[asyncio.Lock] = None

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def check(self) -> None:
        """Raise RequestStopped if this generation must stop now."""
        if self.runner.closing.is_set():
            raise RequestStopped(503, "the server is shutting down", code="shutting_down")
        if self.cancelled.is_set():
            raise RequestStopped(499, "the client went away", code="client_closed")
        if time.monotonic() > self.deadline:
            raise RequestStopped(504, f"the request took longer than {self.runner.request_timeout:g} s "
                                      "(the server's --request-timeout)", code="timeout")


_serving = threading.local()  # .job: the job a model thread is serving (several runners may share a model)


def _watched(tokens: Iterator[int], job: Optional[Job]) -> Iterator[int]:
    """`tokens`, checking `job` before each one is handed on; closes `tokens` at the end."""
    try:
        if job is not None and job.generate_nothing:
            return
        for tok in tokens:
            if job is not None:
                job.check()
            yield tok
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()


def _after(post: Optional[Callable[[Any], Any]], result: Any) -> Any:
    return result if post is None else post(result)


class ModelRunner:
    """Runs requests against `llm` (a `llama_dflash.highlevel.Llama` or anything with its methods)."""

    def __init__(self, llm: Any, *, max_queue: int = 16, request_timeout: float = 300.0):
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if not request_timeout > 0:
            raise ValueError("request_timeout must be > 0")
        self.llm = llm
        self.max_queue = max_queue
        self.request_timeout = float(request_timeout)
        self.closing = threading.Event()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-dflash-model")
        self._admitted = 0  # waiting or running
        self._count = threading.Lock()
        self._locks: dict[int, asyncio.Lock] = {}  # one per event loop (test clients may run several)
        self._closed = False
        original = type(llm).generate.__get__(llm)  # the class's, not an earlier runner's wrapper

        def generate(*args: Any, **kwargs: Any) -> Iterator[int]:
            return _watched(original(*args, **kwargs), getattr(_serving, "job", None))

        llm.generate = generate  # instance attribute: llama-cpp-python calls self.generate

    @property
    def admitted(self) -> int:
        """Requests waiting for the model or running on it."""
        return self._admitted

    # ---- taking and giving back the model ---------------------------------------------------------
    async def acquire(self, generate_nothing: bool = False) -> Job:
        """Wait for the model (APIError 503 when the queue is full, shutting down or the wait
        outlasts the deadline)."""
        arrived = time.monotonic()
        if self.closing.is_set():
            raise APIError(503, "the server is shutting down", code="shutting_down")
        with self._count:
            if self._admitted > self.max_queue:
                raise APIError(503, f"the server is busy ({self.max_queue} requests waiting); retry later",
                               code="queue_full")
            self._admitted += 1
        job = Job(self, arrived + self.request_timeout, generate_nothing)
        loop = asyncio.get_running_loop()
        lock = self._locks.setdefault(id(loop), asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), timeout=max(0.0, job.remaining()))
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            self._leave()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise APIError(503, "timed out waiting for the model (the server is busy)", code="queue_timeout") from None
        job._loop, job._lock = loop, lock
        if self.closing.is_set():
            self.release(job)
            raise APIError(503, "the server is shutting down", code="shutting_down")
        return job

    def _leave(self) -> None:
        with self._count:
            self._admitted -= 1

    def release(self, job: Job) -> None:
        """Give the model back once `job`'s stream (if any) is closed on the model thread.  Safe to
        call from a cancelled task: the close is queued behind any step still running."""
        lock, loop, job._lock = job._lock, job._loop, None
        if lock is None:
            return

        def close_chunks() -> None:
            chunks, job.chunks = job.chunks, None
            if chunks is not None:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()

        def unlock(_f: Optional[Future] = None) -> None:
            self._leave()
            loop.call_soon_threadsafe(lock.release)

        try:
            self._thread.submit(close_chunks).add_done_callback(unlock)
        except RuntimeError:  # the model thread is gone (shut down): nothing left to close
            unlock()

    # ---- work on the model thread ---------------------------------------------------------------
    async def _on_model(self, job: Job, fn: Callable[[], Any]) -> Any:
        def task() -> Any:
            _serving.job = job  # read when the completion code calls llm.generate
            try:
                job.check()
                return fn()
            finally:
                _serving.job = None

        try:
            future = self._thread.submit(task)
        except RuntimeError:
            raise APIError(503, "the server is shutting down", code="shutting_down") from None
        return await asyncio.wrap_future(future)

    async def call(self, job: Job, fn: Callable[..., Any], kwargs: dict[str, Any],
                   post: Optional[Callable[[Any], Any]] = None) -> Any:
        """`fn(**kwargs)` (a non-streamed completion) on the model thread, rewritten by `post`."""
        return await self._on_model(job, lambda: _after(post, fn(**kwargs)))

    async def start_stream(self, job: Job, fn: Callable[..., Iterator[Any]], kwargs: dict[str, Any],
                           post: Optional[Callable[[Any], Any]] = None) -> Any:
        """Start the stream `fn(**kwargs)` (its chunks rewritten by `post`) and return its first
        chunk (None if it has none): errors in the prompt or the parameters surface here, before
        any byte is sent."""
        def first() -> Any:
            job.chunks = iter(_after(post, fn(**kwargs)))
            return next(job.chunks, None)

        return await self._on_model(job, first)

    async def next_chunk(self, job: Job) -> Any:
        return await self._on_model(job, lambda: next(job.chunks, None) if job.chunks is not None else None)

    # ---- shutdown -------------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        """Refuse new requests and stop running generations at their next token (signal-safe)."""
        self.closing.set()

    def close(self) -> None:
        """Stop, wait for the step in progress, then close the model on its own thread.  Idempotent."""
        self.closing.set()
        if self._closed:
            return
        self._closed = True
        close = getattr(self.llm, "close", None)
        if close is not None:
            self._thread.submit(close).result()
        self._thread.shutdown(wait=True)
