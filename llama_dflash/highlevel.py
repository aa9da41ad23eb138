"""`Llama`: a drop-in `llama_cpp.Llama` whose token generator is DFlash/DSpark speculative decoding.

    from llama_dflash import SpecConfig
    from llama_dflash.highlevel import Llama
    llm = Llama("target.gguf", speculative=SpecConfig("draft.gguf"), n_ctx=2048)
    llm.create_completion("Once upon a time", max_tokens=64, temperature=0)
    llm.create_chat_completion(messages=[...], stream=True)

Everything above the token generator -- tokenisation, chat templates and handlers, stop
sequences, max_tokens, streaming chunks, seeds -- is llama-cpp-python's own code: this class only
overrides `generate()`.  The base class is loaded with `vocab_only=True` (tokenizer and metadata,
no weights); the weights are loaded once, by our engine, with the target context and the draft
context attached to it.

Cache policy: every call starts from empty caches (the engine clears target and draft before the
prefill), so draft and target can never disagree about a reused prefix.  Prompt-prefix reuse is
therefore not done; the price is a full prefill per request.

Sampling: the engine samples every verified row with the same `Sampler` that ordinary decoding
uses and accepts a draft token only while the sample equals it, so outputs are distributed exactly
as with ordinary decoding (see `llama_dflash.sampling`).  Supported: temperature, top_k, top_p,
min_p, repeat/presence/frequency penalties (llama.cpp semantics, last 64 generated tokens), seed,
logit_bias / logits processors, stopping criteria on token ids (they get an empty scores row).
Grammars (`grammar=llama_cpp.LlamaGrammar...`) constrain sampling through llama.cpp's grammar
sampler (see `llama_dflash.grammar`).  Not supported (ValueError): mirostat.  typical_p and tfs_z
are ignored.

Logprobs: `create_completion(logprobs=N)` (streaming or not) and
`create_chat_completion(logprobs=True, top_logprobs=N)` work as with
`llama_cpp.Llama(..., logits_all=True)`: the raw target row each generated token was sampled from
is copied into `scores` (see `llama_dflash.logprobs`) and llama-cpp-python's own code builds the
response.  Only requests that ask for logprobs copy rows; the others sample exactly as before.
With echo=True the prompt tokens' rows come from one extra pass over the prompt with logits for
every row (the generation itself prefills without logits).

Only one generation runs at a time on one object: starting a new one closes a still-open
previous generator first (so an abandoned stream cannot rewind the caches under the new one).
Callers that share an object between threads must hold `llm.lock` around each request.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import llama_cpp
import numpy as np

from .config import SpecConfig, TargetConfig
from .engine import LlamaDFlashDecoding, OrdinaryDecoding
from .inspect import read_gguf
from .grammar import GrammarMask
from .logprobs import ScoreRecorder
from .sampling import SamplingParams
from .stats import SpecStats

__all__ = ["Llama", "stats_summary"]

_UNSUPPORTED_INIT = ("vocab_only", "logits_all", "embedding", "draft_model")
_SUMMARY_KEYS = (
    "algorithm", "draft_n_max", "drafted", "verified", "accepted", "verification_steps", "rollbacks",
    "generated_tokens", "prompt_tokens", "acceptance_rate", "mean_accepted_length", "tokens_per_second",
    "prefill_seconds", "total_seconds",
)


def stats_summary(stats: SpecStats) -> dict[str, Any]:
    """The per-response `speculative` field: counters and derived rates of one generation."""
    d = stats.to_dict()
    return {k: d[k] for k in _SUMMARY_KEYS}


class Llama(llama_cpp.Llama):
    """`llama_cpp.Llama` with speculative decoding (`speculative=SpecConfig(...)`) or, with
    `speculative=None`, the engine's ordinary decoding (same prefill and sampler)."""

    def __init__(
        self,
        model_path: str,
        *,
        speculative: Optional[SpecConfig] = None,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: Optional[int] = None,
        n_gpu_layers: int = 0,
        seed: int = llama_cpp.LLAMA_DEFAULT_SEED,
        verbose: bool = False,
        repack: Optional[bool] = None,
        **kwargs: Any,
    ):
        for name in _UNSUPPORTED_INIT:
            if kwargs.pop(name, None):
                raise ValueError(f"llama_dflash.Llama does not support {name}=True")
        if n_ctx <= 0:
            n_ctx = int(read_gguf(model_path).n_ctx_train) or 4096
        n_batch = min(n_batch, n_ctx)
        n_ubatch = min(n_ubatch, n_batch)
        self._engine = None
        super().__init__(
            model_path, vocab_only=True, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
            n_threads=n_threads, n_gpu_layers=n_gpu_layers, seed=seed, verbose=verbose, **kwargs,
        )
        config = TargetConfig(model_path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
                              n_gpu_layers=n_gpu_layers, verbose=verbose, repack=repack)
        self.speculative = speculative
        self._engine = LlamaDFlashDecoding(config, speculative) if speculative is not None else OrdinaryDecoding(config)
        self._n_ctx = self._engine.target.n_ctx
        self.lock = threading.Lock()
        self.last_stats: SpecStats = self._engine.last_stats
        self._active: Optional[Iterator[int]] = None
        self._record_into: Optional[np.ndarray] = None  # scores buffer of a logprobs request
        self._record_prompt = False

    # ---- what llama_cpp.Llama asks of its model -----------------------------------------------
    def n_ctx(self) -> int:
        return self._engine.target.n_ctx if self._engine is not None else super().n_ctx()

    def n_embd(self) -> int:
        return self._engine.target.n_embd if self._engine is not None else super().n_embd()

    @property
    def engine(self):
        return self._engine

    def close(self) -> None:
        self._close_active()
        engine, self._engine = getattr(self, "_engine", None), None
        if engine is not None:
            engine.close()
        if hasattr(self, "_stack"):
            super().close()

    def _close_active(self) -> None:
        active, self._active = getattr(self, "_active", None), None
        if active is not None:
            try:
                active.close()
            except ValueError:  # already executing (another thread): nothing safe to do here
                pass

    # ---- the token generator ------------------------------------------------------------------
    def _create_completion(self, *args: Any, **kwargs: Any):
        if kwargs.get("logprobs") is None:
            return super()._create_completion(*args, **kwargs)
        return self._create_completion_with_logprobs(args, kwargs)

    def _create_completion_with_logprobs(self, args: tuple, kwargs: dict) -> Iterator[Any]:
        """The base completion with a scores buffer that `generate()` fills row by row.

        Runs lazily like the base generator: the buffer is installed when the request starts
        (the base calls `generate()` in that same step, which takes it) and dropped at its end."""
        # zeros: pages of rows never written (prompt rows, the unused tail) cost no memory
        scores = np.zeros((self._n_ctx, self._n_vocab), dtype=np.single)
        saved = self.scores
        self.scores = scores
        self._record_into = scores
        self._record_prompt = bool(kwargs.get("echo"))  # echo: the prompt tokens' logprobs too
        self._logits_all = True  # the base refuses logprobs without it; nothing else reads it here
        try:
            yield from super()._create_completion(*args, **kwargs)
        finally:
            if self._record_into is scores:
                self._record_into = None
            if self.scores is scores:  # else a later logprobs request owns both by now
                self.scores = saved
                self._logits_all = False

    def sampling_params(
        self, *, temp: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
        frequency_penalty: float, presence_penalty: float, prompt: Sequence[int] = (),
        logits_processor: Optional[llama_cpp.LogitsProcessorList] = None,
    ) -> SamplingParams:
        """llama-cpp-python's sampling arguments as our SamplingParams (llama.cpp's chain order)."""
        seed = None if self._seed in (None, llama_cpp.LLAMA_DEFAULT_SEED, -1) else int(self._seed)
        if temp < 0.0:  # llama-cpp-python: sample the untruncated softmax
            temp, top_k, top_p, min_p = 1.0, 0, 1.0, 0.0
        hook = None
        if logits_processor:
            prompt_ids = [int(t) for t in prompt]
            procs = list(logits_processor)

            def hook(generated: Sequence[int], logits: np.ndarray) -> np.ndarray:
                ids = np.array(prompt_ids + list(generated), dtype=np.intc)
                for proc in procs:
                    logits = proc(ids, logits)
                return logits

        return SamplingParams(
            temperature=float(temp), top_k=max(0, int(top_k)), top_p=float(top_p) if 0 < top_p <= 1 else 1.0,
            min_p=max(0.0, float(min_p)), seed=seed, repeat_penalty=float(repeat_penalty) or 1.0,
            frequency_penalty=float(frequency_penalty), presence_penalty=float(presence_penalty),
            penalty_last_n=self.last_n_tokens_size, temperature_last=True, logits_hook=hook,
        )

    def generate(  # type: ignore[override]
        self,
        tokens: Sequence[int],
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        reset: bool = True,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        penalize_nl: bool = True,
        logits_processor: Optional[llama_cpp.LogitsProcessorList] = None,
        stopping_criteria: Optional[llama_cpp.StoppingCriteriaList] = None,
        grammar: Optional[llama_cpp.LlamaGrammar] = None,
    ) -> Iterator[int]:
        """Yield generated tokens (EOG tokens included, as llama_cpp.Llama does; the caller stops)."""
        if self._engine is None:
            raise RuntimeError("this Llama is closed")
        if mirostat_mode:
            raise ValueError("mirostat sampling is not supported with llama_dflash.Llama")
        prompt = [int(t) for t in tokens]
        params = self.sampling_params(
            temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, prompt=prompt,
            logits_processor=logits_processor,
        )
        mask = None
        if grammar is not None:  # before the recorder: logprobs stay those of the raw rows
            mask = GrammarMask(self._model.vocab, grammar, self._n_vocab, params.logits_hook)
            params = dataclasses.replace(params, logits_hook=mask)
        record, self._record_into = self._record_into, None  # only the request that set it
        if record is not None:
            if self._record_prompt:
                self._record_prompt_rows(prompt, record)
            params = dataclasses.replace(
                params, logits_hook=ScoreRecorder(record, len(prompt) - 1, params.logits_hook))
        # unbounded like llama_cpp.Llama.generate (up to the context size): _create_completion
        # sometimes asks for one more token than max_tokens (incomplete UTF-8 at the end)
        return self._run(prompt, params, self.n_ctx() - len(prompt), stopping_criteria,
                         on_close=mask.close if mask is not None else None)

    def _record_prompt_rows(self, prompt: list[int], scores: np.ndarray) -> None:
        """Rows 0..n-2 of `scores`: the target's logits after each prompt token but the last
        (what echo=True logprobs read).  The generation prefills without logits, so this is one
        extra pass over the prompt with logits for every row; the caches are reset afterwards
        (the draft did not see that pass), so the generation starts from scratch."""
        self._close_active()
        target = self._engine.target
        target.clear()
        body = prompt[:-1]
        step = target.ctx.n_batch
        for start in range(0, len(body), step):
            chunk = body[start : start + step]
            target.decode(chunk, start, logits="all")
            for i in range(len(chunk)):
                scores[start + i, :] = target.logits_row(i)
        target.clear()
        self._engine.forget_cache()

    def _run(self, prompt: list[int], params: SamplingParams, limit: int,
             stopping_criteria: Optional[llama_cpp.StoppingCriteriaList] = None,
             on_close: Optional[Callable[[], None]] = None) -> Iterator[int]:
        self._close_active()  # an abandoned generator must not rewind the caches under this one
        # like llama_cpp.Llama, the cached prefix shared with the last call is not decoded again
        inner = self._engine.stream(prompt, max(0, limit), params, ignore_eos=True, reuse_prefix=True)
        self._active = inner
        self.last_stats = self._engine.last_stats
        # input_ids/n_tokens mirror the sequence, as llama_cpp.Llama keeps them (stopping criteria
        # and _create_completion read them); scores are not kept: criteria get an empty row
        n = len(prompt)
        self.input_ids[:n] = prompt
        self.n_tokens = n
        no_scores = np.zeros(0, dtype=np.single)
        try:
            for tok in inner:
                if n < self.input_ids.shape[0]:
                    self.input_ids[n] = tok
                    n += 1
                    self.n_tokens = n
                if stopping_criteria is not None and stopping_criteria(self.input_ids[:n], no_scores):
                    return
                yield tok
        finally:
            inner.close()
            if self._active is inner:
                self._active = None
            if on_close is not None:
                on_close()

    # ---- responses carry the statistics ---------------------------------------------------------
    def create_completion(self, *args: Any, **kwargs: Any):
        result = super().create_completion(*args, **kwargs)
        return self._with_stats(result)

    def create_chat_completion(self, *args: Any, **kwargs: Any):
        result = super().create_chat_completion(*args, **kwargs)
        return self._with_stats(result)

    def _with_stats(self, result: Any):
        if isinstance(result, dict):
            result["speculative"] = stats_summary(self.last_stats)
            return result
        return self._stream_with_stats(result)

    def _stream_with_stats(self, chunks: Iterator[dict]) -> Iterator[dict]:
        try:
            for chunk in chunks:
                choices = chunk.get("choices") or []
                if choices and choices[0].get("finish_reason") is not None:
                    chunk["speculative"] = stats_summary(self.last_stats)
                yield chunk
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
