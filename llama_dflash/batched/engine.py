"""Many sequences in one target context: continuous batching with per-sequence speculation.

    from llama_dflash.batched import BatchedEngine
    from llama_dflash.sampling import SamplingParams
    with BatchedEngine("target.gguf", n_seq=4, n_ctx_seq=1024) as engine:
        outs = engine.generate([prompt_a, prompt_b, prompt_c], max_tokens=64)   # token lists

One llama.cpp context holds `n_seq` sequences (seq ids 0..n_seq-1, one KV stream of `n_ctx_seq`
cells each, as `llama-server -np N` lays them out).  A step decodes every active sequence's rows
in ONE `llama_process` call: its last sampled token, or ``[id_last, drafts...]`` when its drafters
propose a continuation.  Each sequence samples its own rows with its own llama.cpp sampler chain
(`sampling.Sampler`, built as llama-cpp-python builds it), accepts drafts while they equal the
sample, and the rejected rows are removed from its stream alone (`llama_memory_seq_rm` with its
seq id).  Requests join (`submit`) and leave (end of generation, `cancel`) between steps.

Why answers do not depend on the company a request keeps: every sequence has its own KV stream
(a non-unified cache), so its attention reads only its own cells, laid out as in a context of its
own; a new prompt is prefilled in a decode of its own, chunked by `n_batch` as llama-cpp-python
chunks it, so its rows go through the same kernels as when it is served alone; and the
matrix products compute each row independently of the others.  With flash attention on (the
default here), greedy answers therefore equal the answers of the same prompt decoded alone
(`tests/test_batched.py` checks it against batches of other requests).

Drafting: the token-only drafters of a `SpecConfig` (llama.cpp's n-gram types, our suffix
lookup), one set per sequence, in llama.cpp's priority order (the first that proposes wins the
step; all are told the verification's outcome), then the DFlash/DSpark/DFlash2 draft model where
the SpecConfig has one (`draft.BatchedDraft`: one draft context with a stream per slot, features
injected per sequence, one draft decode holding every drafting sequence's block).  With
draft_n_max "auto" the draft length of a step is chosen from the measured cost of whole steps at
that batch width (`lengths.StepLengths`), so the draft runs only where the batch gains from it.
`spec_type auto` (our per-step choice between lookup and the draft) is not batched.  Recurrent
and hybrid targets are batched for ordinary decoding (one recurrent state per sequence, no prefix
reuse: a state cannot be cut back to a prefix); drafting for them is refused, since a rejected
draft could not be cut from a sequence's state.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from llama_cpp import llama_cpp as ll

import numpy as np

from .. import _bindings as ext
from .._llama import BatchExt, Context, Model
from ..errors import LlamaCallError
from ..generate import check_token_ids
from ..draft_models import Eagle3Info, SimpleDraftInfo, resolve_draft
from ..inspect import check_gguf_file
from ..proposers.base import TokenDrafter
from ..proposers.factory import build_token_drafters
from ..rewind import is_recurrent_model
from ..sampling import Sampler, SamplingParams
from ..target import FLASH_ATTN_TYPES, float_view
from .ar_draft import BatchedEagle3Draft, BatchedSimpleDraft
from .draft import BatchedDraft, Block
from .lengths import StepLengths
from .prompt_cache import PromptCache, load_seq_state, save_seq_state

__all__ = ["BatchedEngine", "Sequence_", "SeqStats", "physical_cores", "EngineClosed"]

DEFAULT_DRAFT_N_MAX = 8  # a token drafter's longest draft when the SpecConfig says "auto"
DEFAULT_CACHE_MIB = 512  # host memory for saved slot states (llama-server's --cache-ram)
_MIN_CACHED = 4  # fewer tokens than this are not worth saving or restoring a state for


class EngineClosed(RuntimeError):
    """The engine was closed while the sequence waited or ran."""


def physical_cores() -> int:
    """Physical cores of this machine (llama.cpp's default thread count), from Linux's CPU
    topology; os.cpu_count() where that cannot be read."""
    cores: set[tuple[str, str]] = set()
    base = "/sys/devices/system/cpu"
    try:
        names = [n for n in os.listdir(base) if n.startswith("cpu") and n[3:].isdigit()]
        for name in names:
            topo = os.path.join(base, name, "topology")
            try:
                with open(os.path.join(topo, "core_id")) as fh:
                    core = fh.read().strip()
                with open(os.path.join(topo, "physical_package_id")) as fh:
                    package = fh.read().strip()
            except OSError:
                continue
            cores.add((package, core))
    except OSError:
        pass
    return max(1, len(cores) or os.cpu_count() or 1)


@dataclass
class SeqStats:
    """One sequence's counters, with the names of `SpecStats` (the per-response `speculative` field)."""

    algorithm: str = "ordinary"
    draft_n_max: int = 0
    draft_model_steps: int = 0  # steps whose drafts came from the draft model
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose cache cells a previous request of the slot left
    generated_tokens: int = 0
    drafted: int = 0
    verified: int = 0
    accepted: int = 0
    verification_steps: int = 0
    rollbacks: int = 0
    prefill_seconds: float = 0.0
    first_token_seconds: float = 0.0
    total_seconds: float = 0.0
    queued_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        aps = self.accepted / self.verification_steps if self.verification_steps else 0.0
        tau = 1.0 + aps if self.verification_steps else 0.0
        return {
            "algorithm": self.algorithm, "draft_n_max": self.draft_n_max, "drafted": self.drafted,
            "verified": self.verified, "accepted": self.accepted, "verification_steps": self.verification_steps,
            "rollbacks": self.rollbacks, "generated_tokens": self.generated_tokens,
            "draft_model_steps": self.draft_model_steps,
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "acceptance_rate": self.accepted / self.verified if self.verified else 0.0,
            "accepted_per_step": aps, "mean_accepted_length": tau, "tau": tau,
            "tokens_per_second": self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0,
            "prefill_seconds": self.prefill_seconds, "total_seconds": self.total_seconds,
        }


_DONE = object()  # the end marker in a sequence's token queue


class Sequence_:
    """One request in the engine: its prompt, limits, sampler, drafters and what it produced.

    Thread-safe from the outside: `tokens()` iterates the emitted tokens as they come (blocking),
    `wait()` blocks until the end, `cancel()` stops it before the next step.  `finish_reason`:
    "stop" (an end-of-generation token, emitted as the last token), "length" (max_tokens or the
    slot's context), "cancelled", or "error" (`error` holds the exception)."""

    def __init__(self, engine: "BatchedEngine", prompt: list[int], max_tokens: int, params: SamplingParams,
                 on_token: Optional[Callable[[int], None]]):
        self.engine = engine
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.params = params
        self.on_token = on_token
        self.output: list[int] = []
        self.finish_reason: Optional[str] = None
        self.error: Optional[BaseException] = None
        self.stats = SeqStats(algorithm=engine.algorithm, draft_n_max=engine.draft_n_max,
                              prompt_tokens=len(prompt))
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._cancel = threading.Event()
        self._submitted = time.perf_counter()
        self._started = 0.0
        # engine-side state
        self.seq_id = -1
        self.sampler: Optional[Sampler] = None
        self.drafters: list[TokenDrafter] = []
        self.history: list[int] = []  # the tokens in the sequence's cache, positions 0..n_past-1
        self.last: int = -1  # sampled, not decoded yet
        self.prefilled = False
        self._winner = -1  # which drafter proposed this step's drafts (len(drafters): the draft model)
        self._model_drafted = False

    # ---- the caller's side ------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def cancel(self) -> None:
        """Stop before the next step (the tokens emitted so far stay)."""
        self._cancel.set()
        self.engine._wake()

    def wait(self, timeout: Optional[float] = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.finish_reason is not None, timeout)

    def tokens(self, timeout: Optional[float] = None) -> Iterator[int]:
        """The emitted tokens as they come; raises the sequence's error at the end, TimeoutError
        when none arrives within `timeout` seconds."""
        while True:
            with self._cond:
                if not self._queue and not self._cond.wait_for(lambda: bool(self._queue), timeout):
                    raise TimeoutError("no token within the timeout")
                item = self._queue.popleft()
            if item is _DONE:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def next_token(self, timeout: Optional[float] = None) -> Optional[int]:
        """The next emitted token; None when none came within `timeout` seconds; -1 at the end
        (raises the sequence's error there)."""
        with self._cond:
            if not self._queue and not self._cond.wait_for(lambda: bool(self._queue), timeout):
                return None
            item = self._queue[0]
            if item is not _DONE:
                self._queue.popleft()
        if item is _DONE:
            if self.error is not None:
                raise self.error
            return -1
        return item

    def summary(self) -> dict[str, Any]:
        """`stats.summary()`, timed up to now while the sequence still runs."""
        out = self.stats.summary()
        if self.finish_reason is None and self._started:
            out["total_seconds"] = elapsed = time.perf_counter() - self._started
            out["tokens_per_second"] = self.stats.generated_tokens / elapsed if elapsed > 0 else 0.0
        return out

    # ---- the engine's side ------------------------------------------------------------------------------
    def _emit(self, tok: int) -> None:
        self.output.append(tok)
        self.stats.generated_tokens += 1
        if self.stats.generated_tokens == 1:
            self.stats.first_token_seconds = time.perf_counter() - self._started
        if self.on_token is not None:
            self.on_token(tok)
        with self._cond:
            self._queue.append(tok)
            self._cond.notify_all()

    def _finish(self, reason: str, error: Optional[BaseException] = None) -> None:
        if self.finish_reason is not None:
            return
        self.stats.total_seconds = time.perf_counter() - self._started if self._started else 0.0
        with self._cond:
            self.error = error
            self.finish_reason = reason
            self._queue.append(_DONE)
            self._cond.notify_all()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class BatchedEngine:
    """`n_seq` sequences decoded together on one target model (see the module's docstring).

    `model`: a path, or a `_llama.Model` someone else owns (e.g. borrowed from a llama_cpp.Llama).
    `n_ctx_seq`: the context of each sequence (a slot); `n_batch`: the largest decode (a prompt
    longer than that is prefilled in chunks of it).  `spec`: a SpecConfig whose drafters (n-gram
    types, lookup, a DFlash/DSpark draft model) draft for every sequence; None: ordinary decoding.
    `max_rows`: rows a step may verify across all sequences (default n_batch).
    `prefix_reuse`: a slot keeps its last request's cache cells, and a new request goes to the free
    slot whose cells share the longest prefix with its prompt; only the rest is prefilled (as
    llama-server's `cache_prompt` and llama-cpp-python's own prefix reuse do).
    `cache_mib`: host memory for the states of slots about to be overwritten (`prompt_cache`), so
    that a prompt seen before but no longer in any slot is restored, not prefilled (llama-server's
    `--cache-ram`); 0: none."""

    def __init__(self, model: "str | Model", *, n_seq: int = 4, n_ctx_seq: int = 2048, n_batch: int = 512,
                 n_threads: Optional[int] = None, flash_attn: str = "on", spec: Any = None,
                 n_gpu_layers: int = -1, max_rows: Optional[int] = None, prefix_reuse: bool = True,
                 cache_mib: float = DEFAULT_CACHE_MIB):
        if not isinstance(n_seq, int) or n_seq < 1:
            raise ValueError(f"n_seq must be an integer >= 1, not {n_seq!r}")
        if n_ctx_seq < 16:
            raise ValueError(f"n_ctx_seq must be >= 16, not {n_ctx_seq}")
        if flash_attn not in FLASH_ATTN_TYPES:
            raise ValueError(f"flash_attn must be one of {', '.join(FLASH_ATTN_TYPES)}, not {flash_attn!r}")
        if spec is not None and "auto" in getattr(spec, "spec_types", ()):
            raise ValueError("the batched engine does not run spec_type auto; name the drafters "
                             "(e.g. ngram-simple, lookup, draft-dspark)")
        if spec is not None and getattr(spec, "uses_mtp", False):
            raise ValueError("the batched engine does not draft with the target's MTP head (draft-mtp): the models "
                             "with one (qwen35, qwen35moe, ...) are hybrid, and a rejected draft cannot be cut from "
                             "a sequence's recurrent state in a batch; serve draft-mtp with --parallel 1")
        self.spec = spec if spec is not None and spec.spec_types else None
        if self.spec is not None:
            build_token_drafters(self.spec)  # fail here, not at the first request
        self.algorithm = ",".join(self.spec.spec_types) if self.spec is not None else "ordinary"
        n_max = getattr(self.spec, "draft_n_max", 0) if self.spec is not None else 0
        #: the longest draft of a token drafter (n-gram types, lookup)
        self.token_n_max = int(n_max) if isinstance(n_max, int) else (DEFAULT_DRAFT_N_MAX if self.spec else 0)
        self.draft_n_max = self.token_n_max  # the longest draft of any drafter (statistics)
        self._own_model = isinstance(model, (str, os.PathLike))
        draft_info = None
        if self.spec is not None and self.spec.uses_draft_model:
            ext.check_symbols()
            # both files checked in Python first: llama.cpp aborts the process on several mismatches
            draft_info = resolve_draft(check_gguf_file(os.fspath(model) if self._own_model else model.path),
                                       self.spec.draft_model, self.spec.algorithm)
            # the draft's type as llama.cpp names it ("draft" given: the file's type)
            self.algorithm = ",".join(self.spec.token_types + (draft_info.kind,))
        self.model = Model(os.fspath(model), n_gpu_layers=n_gpu_layers) if self._own_model else model
        self.draft: Any = None  # BatchedDraft, BatchedSimpleDraft or BatchedEagle3Draft
        self.lengths: Optional[StepLengths] = None
        self.ctx = None
        self.batch = None
        try:
            self.recurrent = is_recurrent_model(self.model)
            if self.recurrent and self.spec is not None:
                raise ValueError("the batched engine cannot draft for recurrent or hybrid targets: a rejected "
                                 "draft cannot be cut from a sequence's recurrent state at a position (serve "
                                 "them ordinarily in a batch, or with a draft at --parallel 1)")
            params = ll.llama_context_default_params()
            params.n_seq_max = n_seq
            params.kv_unified = False  # one KV stream per sequence, as llama-server -np N lays it out
            params.n_ctx = n_ctx_seq * n_seq
            params.n_batch = n_batch
            params.n_ubatch = n_batch
            threads = n_threads or physical_cores()
            params.n_threads = threads
            params.n_threads_batch = threads
            params.flash_attn_type = FLASH_ATTN_TYPES[flash_attn]
            params.no_perf = True
            self.ctx = Context(self.model, params)
            self.batch = BatchExt(self.ctx)
            self._layers: tuple[int, ...] = ()
            if draft_info is not None:
                self._layers = tuple(int(x) for x in draft_info.target_layers)
                for lid in self._layers:
                    ext.llama_set_embeddings_layer_inp(self.ctx.ptr, lid, True)
                self._layer_inp = ext.llama_get_embeddings_layer_inp_addr.resolve()
                kind = (BatchedEagle3Draft if isinstance(draft_info, Eagle3Info) else
                        BatchedSimpleDraft if isinstance(draft_info, SimpleDraftInfo) else BatchedDraft)
                self.draft = kind(draft_info, self.spec, self.model, self.ctx, n_seq=n_seq, n_ctx_seq=n_ctx_seq,
                                  n_threads=self.spec.draft_n_threads or threads, n_gpu_layers=n_gpu_layers)
                self.lengths = StepLengths(self.draft.n_max, None if self.spec.adaptive else self.draft.n_max)
                self.draft_n_max = max(self.draft.n_max, self.token_n_max if build_token_drafters(self.spec) else 0)
        except BaseException:
            for h in (self.draft, self.batch, self.ctx):
                if h is not None:
                    h.close()
            if self._own_model:
                self.model.close()
            raise
        self.n_seq = n_seq
        self.n_ctx_seq = int(ll.llama_n_ctx_seq(self.ctx.ptr)) if hasattr(ll, "llama_n_ctx_seq") else n_ctx_seq
        self.n_ctx_seq = min(self.n_ctx_seq, n_ctx_seq)  # llama.cpp pads a stream to 256 cells
        self.n_batch = self.ctx.n_batch
        self.max_rows = min(max_rows or self.n_batch, self.n_batch)
        self.n_threads = threads
        self.n_vocab = self.model.n_vocab
        self._free_ids = list(range(n_seq))
        # a recurrent state holds the whole history: no prefix of it can be kept (each request starts clean)
        self.prefix_reuse = bool(prefix_reuse) and not self.recurrent
        self._cached: dict[int, list[int]] = {}  # slot -> the tokens its cells hold (positions 0..)
        if not cache_mib >= 0:
            raise ValueError(f"cache_mib must be >= 0, not {cache_mib!r}")
        self.prompt_cache = PromptCache(int(cache_mib * (1 << 20))) if prefix_reuse and cache_mib > 0 else None
        self.restored_tokens = 0
        self._waiting: collections.deque[Sequence_] = collections.deque()
        self._active: list[Sequence_] = []
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._step_lock = threading.Lock()  # one step at a time (the background loop or a caller)
        # counters over the engine's life (the server's /metrics)
        self.steps = 0
        self.rows_decoded = 0
        self.seqs_in_steps = 0  # sum over steps of the sequences they decoded (occupancy)
        self.decode_seconds = 0.0
        self.prefill_seconds = 0.0  # prompt decodes
        self.step_seconds = 0.0  # whole steps: the engine thread's busy time
        self.prompt_tokens = 0
        self.cached_tokens = 0

    # ---- admission --------------------------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], *, max_tokens: int = 16, params: Optional[SamplingParams] = None,
               on_token: Optional[Callable[[int], None]] = None) -> Sequence_:
        """Queue one generation of at most `max_tokens` tokens (fewer where the slot's context ends)."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("the prompt must contain at least one token")
        check_token_ids(prompt, self.n_vocab)
        if len(prompt) >= self.n_ctx_seq:
            raise ValueError(f"the prompt has {len(prompt)} tokens; a slot holds {self.n_ctx_seq} (n_ctx_seq)")
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, not {max_tokens!r}")
        seq = Sequence_(self, prompt, min(max_tokens, self.n_ctx_seq - len(prompt)), params or SamplingParams(),
                        on_token)
        with self._work:
            if self._closed:
                raise EngineClosed("the engine is closed")
            if seq.max_tokens == 0:
                seq._finish("length")
                return seq
            self._waiting.append(seq)
            self._work.notify_all()
        return seq

    def _wake(self) -> None:
        with self._work:
            self._work.notify_all()

    @property
    def n_active(self) -> int:
        return len(self._active)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    # ---- batch API --------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], *, max_tokens: int = 16,
                 params: "Optional[SamplingParams | Sequence[SamplingParams]]" = None) -> list[list[int]]:
        """Every prompt's generated tokens (an end-of-generation token, when sampled, ends its list).
        Drives the steps itself unless the background loop (`start`) runs."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("give one SamplingParams per prompt, or one for all")
        seqs = [self.submit(p, max_tokens=max_tokens, params=sp) for p, sp in zip(prompts, plist)]
        if self._thread is None:
            while not all(s.done for s in seqs):
                self.step()
        for s in seqs:
            s.wait()
            if s.error is not None:
                raise s.error
        return [list(s.output) for s in seqs]

    # ---- the background loop (a server feeds it with `submit`) -------------------------------------------
    def start(self) -> None:
        """Run the steps on a thread of the engine's own while there is work."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="llama-dflash-batched", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._work:
                while not self._closed and not self._waiting and not self._active:
                    self._work.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a failed decode ends the sequences it carried
                self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for seq in list(self._active):
            self._release(seq, "error", exc)

    # ---- one step ---------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Admit waiting sequences into free slots (prefilling each), then one decode of every
        active sequence's rows.  Returns whether anything was done."""
        with self._step_lock:
            t0 = time.perf_counter()
            try:
                return self._step()
            finally:
                self.step_seconds += time.perf_counter() - t0

    def _step(self) -> bool:
        self._drop_cancelled()
        admitted = self._admit()
        for seq in admitted:
            try:
                self._prefill(seq)
            except LlamaCallError as exc:
                self._release(seq, "error", exc)
        running = [s for s in self._active if s.prefilled and not s.done]
        if running:
            self._decode_step(running)
        return bool(admitted or running)

    def _drop_cancelled(self) -> None:
        with self._work:
            kept = collections.deque()
            for seq in self._waiting:
                if seq._cancel.is_set():
                    seq._finish("cancelled")
                else:
                    kept.append(seq)
            self._waiting = kept
        for seq in list(self._active):
            if seq._cancel.is_set():
                self._release(seq, "cancelled")

    def _admit(self) -> list[Sequence_]:
        out = []
        with self._work:
            while self._waiting and self._free_ids:
                seq = self._waiting.popleft()
                seq.seq_id = self._pick_slot(seq.prompt)
                self._free_ids.remove(seq.seq_id)
                self._active.append(seq)
                out.append(seq)
        self._active.sort(key=lambda s: s.seq_id)
        for seq in out:
            seq._started = time.perf_counter()
            seq.stats.queued_seconds = seq._started - seq._submitted
            seq.sampler = Sampler(seq.params, n_vocab=self.n_vocab)
            if self.spec is not None:
                seq.drafters = build_token_drafters(self.spec)
                for d in seq.drafters:
                    d.begin(seq.prompt)
        return out

    def _pick_slot(self, prompt: list[int]) -> int:
        """The free slot whose cached tokens share the longest prefix with `prompt`; without one,
        the lowest free id (runs of consecutive ids batch best)."""
        best, best_n = min(self._free_ids), 0
        if self.prefix_reuse:
            for sid in sorted(self._free_ids):
                n = _common_prefix(self._cached.get(sid, ()), prompt)
                if n > best_n:
                    best, best_n = sid, n
        return best

    def _release(self, seq: Sequence_, reason: str, error: Optional[BaseException] = None) -> None:
        """End `seq`, give its slot back: its cells stay for the next request's prefix (rows past
        what it accepted are cut), or are emptied after an error or without prefix reuse."""
        if seq in self._active:
            self._active.remove(seq)
            if self.prefix_reuse and error is None and seq.prefilled:
                self.ctx.seq_rm(seq.seq_id, len(seq.history), -1)
                self._cached[seq.seq_id] = seq.history
            else:
                self.ctx.seq_rm(seq.seq_id, -1, -1)
                self._cached.pop(seq.seq_id, None)
                if self.draft is not None:
                    self.draft.truncate(seq.seq_id, 0)
            with self._work:
                self._free_ids.append(seq.seq_id)
                self._free_ids.sort()
        if seq.sampler is not None:
            seq.sampler.close()
            seq.sampler = None
        seq.drafters = []
        seq._finish(reason, error)

    def _prefill(self, seq: Sequence_) -> None:
        """The prompt in a decode of its own (chunks of n_batch), then its first token.  The prefix
        the slot's cells already hold is kept (all but the last prompt token, whose logits are needed)."""
        t0 = time.perf_counter()
        b, sid, prompt = self.batch, seq.seq_id, seq.prompt
        n = len(prompt)
        n_keep = self._reuse(sid, prompt)
        if self.draft is not None:  # (an EAGLE-3 head resumes only where it kept the features)
            n_keep = self.draft.resume_point(sid, n_keep)
        self.ctx.seq_rm(sid, n_keep, -1)
        if self.draft is not None:
            self.draft.truncate(sid, n_keep)
        seq.stats.cached_tokens = n_keep
        self.prompt_tokens += n
        self.cached_tokens += n_keep
        seq.history = list(prompt[:n_keep])  # what the cells hold, should a chunk fail
        n_rows = 0
        for start in range(n_keep, n, self.n_batch):
            chunk = prompt[start:start + self.n_batch]
            b.clear()
            last = start + len(chunk) == n
            for i, tok in enumerate(chunk):
                b.add_token(tok, start + i, last and i == len(chunk) - 1, sid)
            rc = b.process()
            if rc != 0:
                raise LlamaCallError(f"prefill of {len(chunk)} tokens for sequence {sid} failed "
                                     f"(llama_process returned {rc})")
            n_rows = len(chunk)
            if self.draft is not None:
                self.draft.inject(sid, start, self._features(0, n_rows), chunk)
            seq.history = list(prompt[:start + n_rows])
        seq.stats.prefill_seconds = time.perf_counter() - t0
        self.prefill_seconds += seq.stats.prefill_seconds
        seq.history = list(prompt)
        seq.prefilled = True
        tok = seq.sampler.sample(self.ctx.ptr, n_rows - 1)
        self._commit_token(seq, tok)

    def _reuse(self, sid: int, prompt: list[int]) -> int:
        """How many leading prompt tokens the slot's cells hold once it is ready for `prompt`: its
        own cells' common prefix, or a saved state's where that is longer (restored into the slot;
        the cells it replaces are saved first).  At most len(prompt) - 1: the last token's logits
        are needed."""
        if not self.prefix_reuse:
            return 0
        old = self._cached.pop(sid, [])
        n_keep = _common_prefix(old, prompt)
        cache = self.prompt_cache
        if cache is not None:
            if len(old) - n_keep >= _MIN_CACHED:
                self._save_slot(sid, old)
            entry, n = cache.best(prompt)
            if entry is not None and min(n, len(prompt) - 1) - n_keep >= _MIN_CACHED and self._load_slot(sid, entry):
                n_keep = n
                cache.hits += 1
                self.restored_tokens += min(n, len(prompt) - 1)
        return min(n_keep, len(prompt) - 1)

    def _save_slot(self, sid: int, tokens: list[int]) -> None:
        target = save_seq_state(self.ctx.ptr, sid)
        if target is None:
            return
        # (queued rows are written first: they belong in the state saved)
        draft = self.draft.save_slot(sid) if self.draft is not None else None
        self.prompt_cache.put(tokens, target, draft)

    def _load_slot(self, sid: int, entry: Any) -> bool:
        if not load_seq_state(self.ctx.ptr, sid, entry.target):
            self.ctx.seq_rm(sid, -1, -1)
            return False
        if self.draft is not None:
            self.draft.truncate(sid, 0)
            if entry.draft is not None:  # without it the draft lacks the prefix's features: weaker drafts, same answers
                self.draft.load_slot(sid, entry.draft)
        return True

    def _commit_token(self, seq: Sequence_, tok: int) -> bool:
        """Emit `tok`; end the sequence (True) on an end-of-generation token or its limits."""
        seq._emit(tok)
        if self.model.is_eog(tok):
            self._release(seq, "stop")
            return True
        if seq.stats.generated_tokens >= seq.max_tokens or len(seq.history) + 1 >= self.n_ctx_seq:
            self._release(seq, "length")
            return True
        seq.last = tok
        return False

    def _drafts(self, seq: Sequence_, budget: int) -> list[int]:
        if not seq.drafters:
            return []
        room = min(self.token_n_max, budget,
                   seq.max_tokens - seq.stats.generated_tokens - 1,  # more could never be emitted
                   self.n_ctx_seq - 1 - len(seq.history) - 1)  # the rows must fit the slot
        if room <= 0:
            return []
        for k, d in enumerate(seq.drafters):
            draft = d.draft(seq.history, seq.last)
            if draft:
                seq._winner = k
                return [int(t) for t in draft[:room]]
        seq._winner = -1
        return []

    def _model_blocks(self, running: list[Sequence_], plans: list[list[int]], budget: int) -> tuple[int, float]:
        """The draft model's proposals for the sequences no token drafter served, in one draft
        decode; returns (the step's draft length k, the draft's seconds)."""
        k = self.lengths.choose(len(running))
        if k <= 0:
            return 0, 0.0
        blocks, rooms = [], []
        for i, seq in enumerate(running):
            if plans[i]:
                continue
            pos = len(seq.history)
            room = min(k, budget, seq.max_tokens - seq.stats.generated_tokens - 1, self.n_ctx_seq - 2 - pos)
            if room <= 0 or not self.draft.fits(pos, self.n_ctx_seq):
                continue
            budget -= room
            blocks.append((i, Block(seq.seq_id, seq.last, pos, n=room)))
            rooms.append(room)
        if not blocks:
            return 0, 0.0
        t0 = time.perf_counter()
        self.draft.propose([blk for _, blk in blocks])
        for (i, blk), room in zip(blocks, rooms):
            seq = running[i]
            plans[i] = blk.tokens[:room]
            seq._winner = len(seq.drafters)  # the draft model: after every token drafter
            seq._model_drafted = True
        return k, time.perf_counter() - t0

    def _features(self, first: int, n: int) -> np.ndarray:
        """Inputs of the draft's target layers for batch rows first..first+n-1 of the last decode
        (llama.cpp returns them in batch order): a new [n, layers * n_embd] array."""
        e = self.model.n_embd
        out = np.empty((n, len(self._layers) * e), dtype=np.float32)
        ctx = self.ctx.ptr
        for k, lid in enumerate(self._layers):
            ptr = self._layer_inp(ctx, lid)
            if not ptr:
                raise LlamaCallError(f"target layer {lid} input was not extracted")
            out[:, k * e:(k + 1) * e] = float_view(ptr, (first + n, e))[first:]
        return out

    def _decode_step(self, running: list[Sequence_]) -> None:
        b = self.batch
        budget = self.max_rows - len(running)  # one row per sequence comes first
        plans: list[list[int]] = []
        for seq in running:
            seq._model_drafted = False
            drafts = self._drafts(seq, budget)
            budget -= len(drafts)
            plans.append(drafts)
        token_rows = sum(len(d) for d in plans)
        k_model, t_draft = self._model_blocks(running, plans, budget) if self.draft is not None else (0, 0.0)
        b.clear()
        spans = []  # (seq, first row, drafts)
        for seq, drafts in zip(running, plans):
            pos = len(seq.history)
            first = b.n
            b.add_token(seq.last, pos, True, seq.seq_id)
            for i, tok in enumerate(drafts):
                b.add_token(tok, pos + 1 + i, True, seq.seq_id)
            spans.append((seq, first, drafts))
        t0 = time.perf_counter()
        rc = b.process()
        t_verify = time.perf_counter() - t0
        self.decode_seconds += t_verify
        if rc != 0:
            raise LlamaCallError(f"decode of {b.n} rows for {len(running)} sequences failed "
                                 f"(llama_process returned {rc})")
        self.steps += 1
        self.rows_decoded += b.n
        self.seqs_in_steps += len(running)
        ctx = self.ctx.ptr
        model_accepted: list[int] = []
        for seq, first, drafts in spans:
            pos = len(seq.history)
            n_acc = 0
            ended = False
            for i in range(len(drafts) + 1):
                tok = seq.sampler.sample(ctx, first + i)
                seq.history.append(seq.last if i == 0 else drafts[i - 1])
                ended = self._commit_token(seq, tok)
                if ended or i == len(drafts) or tok != drafts[i]:
                    break
                n_acc += 1
            if self.draft is not None:  # the committed rows (features, tokens), for the draft's stream of this slot
                self.draft.inject(seq.seq_id, pos, self._features(first, n_acc + 1), seq.history[pos:pos + n_acc + 1])
            if drafts:
                st = seq.stats
                st.drafted += len(drafts)
                st.verified += len(drafts)
                st.accepted += n_acc
                st.verification_steps += 1
                if n_acc < len(drafts):
                    st.rollbacks += 1
                if seq._model_drafted:
                    st.draft_model_steps += 1
                    model_accepted.append(n_acc)
                for k, d in enumerate(seq.drafters):
                    d.accept(n_acc, k != seq._winner)
            elif seq.drafters:
                for d in seq.drafters:
                    d.accept(0, True)
            if not ended and n_acc < len(drafts):  # rows past the accepted prefix leave this stream
                self.ctx.seq_rm(seq.seq_id, pos + n_acc + 1, -1)
        if self.lengths is not None and not token_rows:  # a step of the draft model alone, or ordinary
            self.lengths.observe(len(running), k_model if model_accepted else 0, model_accepted, t_draft, t_verify)

    # ---- life --------------------------------------------------------------------------------------------
    def busy_slots(self) -> list[int]:
        """The slots (sequence ids) a request holds now."""
        return sorted(s.seq_id for s in list(self._active))

    def stats(self) -> dict[str, Any]:
        """Engine-wide counters: steps, rows, mean sequences per step (occupancy), queue."""
        return {"n_seq": self.n_seq, "active": self.n_active, "waiting": self.n_waiting, "steps": self.steps,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "restored_tokens": self.restored_tokens,
                "prompt_cache_entries": len(self.prompt_cache) if self.prompt_cache is not None else 0,
                "prompt_cache_bytes": self.prompt_cache.nbytes if self.prompt_cache is not None else 0,
                "rows_decoded": self.rows_decoded, "sequences_decoded": self.seqs_in_steps,
                "mean_batch_sequences": self.seqs_in_steps / self.steps if self.steps else 0.0,
                "decode_seconds": self.decode_seconds, "prefill_seconds": self.prefill_seconds,
                "step_seconds": self.step_seconds,
                **({"draft_seconds": self.draft.draft_seconds, "inject_seconds": self.draft.inject_seconds,
                    "draft_blocks": self.draft.blocks, "step_costs": self.lengths.summary()}
                   if self.draft is not None else {})}

    def close(self) -> None:
        """Stop the loop (after the step in progress), end every sequence, free the context."""
        with self._work:
            if self._closed:
                return
            self._closed = True
            self._work.notify_all()
            waiting, self._waiting = list(self._waiting), collections.deque()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._step_lock:
            for seq in waiting:
                seq._finish("error", EngineClosed("the engine was closed"))
            for seq in list(self._active):
                self._release(seq, "error", EngineClosed("the engine was closed"))
            if self.draft is not None:
                self.draft.close()
            self.batch.close()
            self.ctx.close()
            if self._own_model:
                self.model.close()

    def __enter__(self) -> "BatchedEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
