"""`--parallel N`: requests decoded together by `llama_dflash.batched.BatchedEngine` (continuous batching).

Each request runs llama-cpp-python's own completion code (`llama_cpp.Llama.create_completion` /
`create_chat_completion`: prompt building, chat templates, stop strings, streaming, finish reasons,
usage) on a thread of its own, against a `RequestView`: a per-request view of the loaded
`llama_dflash.Llama` whose `generate` submits the prompt to the shared engine and yields the tokens
the engine samples for it.  Everything else the completion code reads (tokenizer, metadata, chat
handler) is the model's; what it would write (the seed) stays in the view, so concurrent requests
never share mutable state.  The answer of a request is therefore built exactly as with
`--parallel 1`, from tokens that do not depend on the requests batched with it.

A request is stopped between tokens when its deadline passes, its client goes away or the server
shuts down (`Job.check`, as `runner.ModelRunner` does); its sequence then leaves the engine at the
next step.  At most `max_queue` requests wait while `n_seq` run (more get 503).  Options the engine
cannot honour (grammars, logprobs, logit_bias) are not taken here: the app sends those requests to
the one-at-a-time `ModelRunner` (see `batchable`).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional

import llama_cpp
import numpy as np

from ..batched import BatchedEngine
from ..sampling import SamplingParams
from .errors import APIError
from .runner import Job, _after

__all__ = ["BatchedRunner", "RequestView", "batchable"]

_POLL = 0.25  # seconds between checks of a request's deadline while it waits for a token


def batchable(kwargs: dict[str, Any]) -> Optional[str]:
    """None when the engine can serve a request with these completion arguments, else the reason."""
    if kwargs.get("grammar") is not None:
        return "grammar"
    if kwargs.get("logprobs") not in (None, False):
        return "logprobs"
    if kwargs.get("logit_bias"):
        return "logit_bias"
    return None


class RequestView:
    """What llama-cpp-python's completion code sees of the model while serving one batched request."""

    create_completion = llama_cpp.Llama.create_completion
    _create_completion = llama_cpp.Llama._create_completion
    create_chat_completion = llama_cpp.Llama.create_chat_completion

    def __init__(self, llm: Any, engine: BatchedEngine, job: Job, max_tokens: int):
        self._llm = llm
        self._engine = engine
        self._job = job
        self._max_tokens = max_tokens
        self._seed = random.getrandbits(32)  # an unseeded request draws its own seed from here
        self.cache = None
        self.verbose = False
        self._n_ctx = engine.n_ctx_seq  # the slot's context bounds the prompt and max_tokens
        self._logits_all = False
        self.seq = None
        self._seen: list[int] = []  # the prompt and the tokens yielded so far

    @property
    def _input_ids(self) -> np.ndarray:
        """What llama-cpp-python's context would hold: the prompt and every yielded token but the
        last (a generation ends before its last token is decoded)."""
        return np.array(self._seen[:-1], dtype=np.intc)

    @property
    def _scores(self) -> np.ndarray:  # read only by stopping criteria after the loop (logprobs are refused)
        return np.zeros((1, int(self._llm.n_vocab())), dtype=np.single)

    def __getattr__(self, name: str) -> Any:  # the tokenizer, metadata, chat handler: the model's
        return getattr(self._llm, name)

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def generate(self, tokens, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                 temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                 mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, penalize_nl: bool = True,
                 logits_processor=None, stopping_criteria=None, grammar=None) -> Iterator[int]:
        if grammar is not None or logits_processor is not None or mirostat_mode:
            raise ValueError("grammars, logits processors and mirostat are not served with --parallel > 1")
        params = SamplingParams(temperature=max(0.0, float(temp)), top_k=int(top_k), top_p=float(top_p),
                                min_p=float(min_p), typical_p=float(typical_p), seed=int(self._seed) & 0xFFFFFFFF,
                                repeat_penalty=float(repeat_penalty), presence_penalty=float(presence_penalty),
                                frequency_penalty=float(frequency_penalty),
                                penalty_last_n=int(self._llm.last_n_tokens_size))
        return self._tokens(list(tokens), params, stopping_criteria)

    def _tokens(self, prompt: list[int], params: SamplingParams, stopping_criteria) -> Iterator[int]:
        job = self._job
        if job.generate_nothing:
            return
        # llama-cpp-python reads past max_tokens while the text ends inside a UTF-8 character (up to 3
        # more tokens); the completion code closes this generator when it is done, which ends the
        # sequence at the engine's next step
        seq = self._engine.submit(prompt, max_tokens=self._max_tokens + 3, params=params)
        self.seq = seq
        try:
            seen = self._seen = list(prompt)
            while True:
                job.check()
                tok = seq.next_token(_POLL)
                if tok is None:
                    continue  # nothing yet: check the deadline again
                if tok < 0:
                    return
                if stopping_criteria is not None and stopping_criteria(np.array(seen, dtype=np.intc),
                                                                       np.empty(0, dtype=np.single)):
                    return
                job.check()
                seen.append(tok)
                yield tok
        finally:
            seq.cancel()


class BatchedRunner:
    """Runs batchable requests on `engine` (its background loop), each on a worker thread.

    The same interface as `runner.ModelRunner` (acquire, call, start_stream, next_chunk, release,
    begin_shutdown, close), so the app and its streams drive either."""

    def __init__(self, llm: Any, engine: BatchedEngine, *, max_queue: int = 16, request_timeout: float = 300.0):
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if not request_timeout > 0:
            raise ValueError("request_timeout must be > 0")
        self.llm = llm
        self.engine = engine
        self.max_queue = max_queue
        self.request_timeout = float(request_timeout)
        self.closing = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=engine.n_seq + max_queue + 2,
                                        thread_name_prefix="llama-dflash-request")
        self._admitted = 0
        self._count = threading.Lock()
        self._closed = False
        engine.start()

    @property
    def admitted(self) -> int:
        return self._admitted

    async def acquire(self, generate_nothing: bool = False) -> Job:
        if self.closing.is_set():
            raise APIError(503, "the server is shutting down", code="shutting_down")
        with self._count:
            if self._admitted >= self.engine.n_seq + self.max_queue:
                raise APIError(503, f"the server is busy ({self.max_queue} requests waiting); retry later",
                               code="queue_full")
            self._admitted += 1
        job = Job(self, time.monotonic() + self.request_timeout, generate_nothing)
        job._lock = True  # held: release() gives it back once
        return job

    def release(self, job: Job) -> None:
        if job._lock is None:
            return
        job._lock = None

        def close_chunks() -> None:
            chunks, job.chunks = job.chunks, None
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

        def leave(_f: Any = None) -> None:
            with self._count:
                self._admitted -= 1

        try:
            self._pool.submit(close_chunks).add_done_callback(leave)
        except RuntimeError:  # shut down: nothing left to close
            leave()

    async def _on_worker(self, job: Job, fn: Callable[[], Any]) -> Any:
        def task() -> Any:
            job.check()
            return fn()

        try:
            future = self._pool.submit(task)
        except RuntimeError:
            raise APIError(503, "the server is shutting down", code="shutting_down") from None
        return await asyncio.wrap_future(future)

    def _view(self, job: Job, kwargs: dict[str, Any]) -> RequestView:
        return RequestView(self.llm, self.engine, job, int(kwargs.get("max_tokens") or 0) or self.engine.n_ctx_seq)

    @staticmethod
    def _entry(view: RequestView, fn: Callable[..., Any]) -> Callable[..., Any]:
        name = getattr(fn, "__name__", "")
        return view.create_chat_completion if "chat" in name else view.create_completion

    async def call(self, job: Job, fn: Callable[..., Any], kwargs: dict[str, Any],
                   post: Optional[Callable[[Any], Any]] = None) -> Any:
        view = self._view(job, kwargs)
        entry = self._entry(view, fn)

        def run() -> Any:
            result = _after(post, entry(**kwargs))
            result["speculative"] = _stats(view)
            return result

        return await self._on_worker(job, run)

    async def start_stream(self, job: Job, fn: Callable[..., Iterator[Any]], kwargs: dict[str, Any],
                           post: Optional[Callable[[Any], Any]] = None) -> Any:
        view = self._view(job, kwargs)
        entry = self._entry(view, fn)

        def first() -> Any:
            job.chunks = _with_stats(iter(_after(post, entry(**kwargs))), view)
            return next(job.chunks, None)

        return await self._on_worker(job, first)

    async def next_chunk(self, job: Job) -> Any:
        return await self._on_worker(job, lambda: next(job.chunks, None) if job.chunks is not None else None)

    def begin_shutdown(self) -> None:
        self.closing.set()

    def close(self) -> None:
        """Stop the requests at their next token, end the engine (it borrows the model: before the model)."""
        self.closing.set()
        if self._closed:
            return
        self._closed = True
        self.engine.close()
        self._pool.shutdown(wait=True)


def _stats(view: RequestView) -> dict[str, Any]:
    seq = view.seq
    if seq is None:
        return {}
    out = seq.summary()
    # the tokens the reply used (a step may have sampled more before the request was done with it)
    used = len(view._seen) - len(seq.prompt)
    out["generated_tokens"] = used
    last = view._seen[-1] if used > 0 else None
    out["completion_tokens"] = used - int(last is not None and bool(
        llama_cpp.llama_vocab_is_eog(view._llm._model.vocab, last)))
    out["tokens_per_second"] = used / out["total_seconds"] if out["total_seconds"] > 0 else 0.0
    return out


def _with_stats(chunks: Iterator[dict], view: RequestView) -> Iterator[dict]:
    """The chunks, the one with the finish reason carrying the request's `speculative` statistics."""
    try:
        for chunk in chunks:
            choices = chunk.get("choices") or []
            if choices and choices[0].get("finish_reason") is not None:
                chunk["speculative"] = _stats(view)
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
