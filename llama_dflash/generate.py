"""The generation loops: ordinary decoding and draft-verify-accept speculative decoding.

Both are generators yielding one token at a time.  Each speculative step is a few small
functions (draft, verify, accept, commit); the cache rewind sits in `finally:` so a consumer
that stops early, or an exception mid-step, leaves target and draft caches consistent with
the tokens actually handed out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Protocol, Sequence

import numpy as np

from ._batch import logits_ith_addr
from .adaptive import ShadowProbe
from .errors import LlamaCallError
from .proposers import Proposer
from .rewind import Rewinder
from .sampling import Sampler
from .stats import SpecStats
from .target import TargetContext

__all__ = [
    "GenerationState", "DraftController", "prefill", "ordinary_generate", "speculative_generate", "check_prompt",
    "check_token_ids",
]


class DraftController(Protocol):
    """Chooses the draft length of each step from what it has observed (see `adaptive`)."""

    def choose(self, n_limit: int) -> int:
        """Draft length for the next step, in 0..n_limit (0: decode ordinarily)."""
        ...

    def observe(self, n_draft: int, n_accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """What the step that drafted n_draft tokens cost and earned."""
        ...

    # optional: `shadow_probe() -> int` asked after `choose` returned 0, and
    # `observe_shadow(n_draft, n_accepted)`: see `adaptive.ShadowProbe`


@dataclass
class GenerationState:
    """Where a generation stands: committed tokens, finish reason, timing."""

    prompt_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None  # "stop" | "length" | None while running
    n_past: int = 0  # target/draft cache positions that are valid


def check_token_ids(tokens: Sequence[int], n_vocab: int) -> None:
    """Ids outside the vocabulary make llama.cpp fail mid-batch (or abort): refuse them first."""
    bad = next((t for t in tokens if not 0 <= int(t) < n_vocab), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})")


def check_prompt(prompt: Sequence[int], n_ctx: int, n_vocab: Optional[int] = None) -> None:
    if len(prompt) == 0:
        raise ValueError("the prompt must contain at least one token")
    if len(prompt) > n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} tokens, more than the context size n_ctx={n_ctx}")
    if n_vocab is not None:
        check_token_ids(prompt, n_vocab)


def prefill(
    target: TargetContext,
    tokens: Sequence[int],
    on_decoded: Optional[Callable[[np.ndarray, int], None]] = None,
    pos0: int = 0,
) -> None:
    """Decode tokens at positions pos0.. in n_batch chunks without logits;
    `on_decoded(features, pos)` after each chunk."""
    step = target.ctx.n_batch
    for start in range(0, len(tokens), step):
        chunk = tokens[start : start + step]
        target.decode(chunk, pos0 + start, logits="none")
        if on_decoded is not None:
            on_decoded(target.layer_features(), pos0 + start)


def _check_reuse(prompt: Sequence[int], n_reuse: int) -> None:
    if not 0 <= n_reuse < len(prompt):
        raise ValueError(f"n_reuse={n_reuse} must leave at least the last prompt token to decode")


def _start_caches(target: TargetContext, proposer: Optional[Proposer], n_reuse: int) -> None:
    """Empty the caches, or keep their first n_reuse positions (prefix reuse)."""
    if n_reuse == 0:
        target.clear()
        if proposer is not None:
            proposer.clear()
        return
    if not target.seq_rm(n_reuse):
        raise LlamaCallError(f"llama_memory_seq_rm failed on the target at position {n_reuse}")
    if proposer is not None:
        proposer.rollback(n_reuse)


def _is_stop(token: int, target: TargetContext) -> bool:
    """End of generation.  With ignore_eos the sampler masks these tokens, so none comes."""
    return target.model.is_eog(token)


class _EogMemo(dict):
    """`model.is_eog` remembered per token id: a generation asks about every token it samples
    (twice in the speculative loop), and the answer of llama.cpp's vocabulary never changes."""

    def __init__(self, model) -> None:
        super().__init__()
        self._model = model

    def __missing__(self, token: int) -> bool:
        value = self[token] = bool(self._model.is_eog(token))
        return value


def ordinary_generate(
    target: TargetContext,
    prompt: Sequence[int],
    max_tokens: int,
    sampler: Sampler,
    *,
    state: Optional[GenerationState] = None,
    stats: Optional[SpecStats] = None,
    n_reuse: int = 0,
) -> Iterator[int]:
    """Plain decoding, one target decode per token, with the same prefill as the speculative loop.

    n_reuse: the cache already holds prompt[:n_reuse] (prefix reuse); 0 starts from scratch."""
    state = state if state is not None else GenerationState()
    stats = stats if stats is not None else SpecStats()
    check_prompt(prompt, target.n_ctx, target.n_vocab)
    _check_reuse(prompt, n_reuse)
    t_start = time.perf_counter()
    _start_caches(target, None, n_reuse)
    state.prompt_tokens = stats.prompt_tokens = len(prompt)
    stats.reused_prompt_tokens = n_reuse
    prefill(target, prompt[n_reuse:-1], pos0=n_reuse)
    stats.prefill_seconds = time.perf_counter() - t_start
    n_past, id_last = len(prompt) - 1, int(prompt[-1])
    state.n_past = n_past
    is_eog = _EogMemo(target.model)
    try:
        while len(state.tokens) < max_tokens:
            if n_past >= target.n_ctx:
                state.finish_reason = "length"
                return
            t0 = time.perf_counter()
            target.decode((id_last,), n_past, logits="last")
            t_sync = time.perf_counter()
            target.logits_row(0)  # synchronises with the device: the decode's time ends here
            t1 = time.perf_counter()
            tok = sampler.sample(target.ctx.ptr, 0)
            stats.sample_seconds += time.perf_counter() - t1
            _count_target(stats, t0, t_sync, t1)
            stats.verification_steps += 1
            n_past += 1
            state.n_past = n_past
            if is_eog[tok]:
                state.finish_reason = "stop"
                return
            if not state.tokens:
                stats.first_token_seconds = time.perf_counter() - t_start
            state.tokens.append(tok)
            stats.generated_tokens += 1
            id_last = tok
            yield tok
        state.finish_reason = "length"
    finally:
        stats.total_seconds = time.perf_counter() - t_start


def speculative_generate(
    target: TargetContext,
    proposer: Proposer,
    prompt: Sequence[int],
    max_tokens: int,
    sampler: Sampler,
    *,
    state: Optional[GenerationState] = None,
    stats: Optional[SpecStats] = None,
    controller: Optional[DraftController] = None,
    rewinder: Optional[Rewinder] = None,
    n_reuse: int = 0,
) -> Iterator[int]:
    """Draft a block, verify it in one target batch, keep the agreeing prefix plus one target token.

    `rewinder` brings the target cache back after a rejection (attention cut by default; the
    recurrent strategies live in `rewind`).  n_reuse: both caches already hold prompt[:n_reuse]
    and nothing beyond it that must stay (the caller checked); 0 starts from scratch."""
    state = state if state is not None else GenerationState()
    stats = stats if stats is not None else SpecStats()
    rewinder = rewinder if rewinder is not None else Rewinder(target, stats)
    rewinder.stats = stats
    stats.rollback_mode = rewinder.mode
    check_prompt(prompt, target.n_ctx, target.n_vocab)
    _check_reuse(prompt, n_reuse)
    t_start = time.perf_counter()
    rewinder.reset()
    _start_caches(target, proposer, n_reuse)
    state.prompt_tokens = stats.prompt_tokens = len(prompt)
    stats.reused_prompt_tokens = n_reuse

    def inject(features: np.ndarray, pos0: int) -> None:
        proposer.inject(features, pos0)

    feeds = getattr(proposer, "needs_features", True)  # token-only drafters read no features
    is_eog = _EogMemo(target.model)
    # the plain KV rewinder does nothing before a verification: skip the call
    plain = getattr(type(rewinder), "before_verify", None) is Rewinder.before_verify \
        and "before_verify" not in vars(rewinder)
    before_verify = None if plain else rewinder.before_verify
    n_batch_limit = target.ctx.n_batch - 1
    n_ctx = target.n_ctx
    shadow_probe = getattr(controller, "shadow_probe", None)
    shadow: Optional[ShadowProbe] = None
    n_past, id_last = len(prompt) - 1, int(prompt[-1])
    history = [int(t) for t in prompt[:-1]]  # the tokens at positions < n_past, for token drafters
    consumed = 0  # tokens handed to the consumer; the caches are rewound to match them
    try:
        prefill(target, prompt[n_reuse:-1], inject if feeds else None, pos0=n_reuse)
        stats.prefill_seconds = time.perf_counter() - t_start
        state.n_past = n_past
        proposer.begin(history)
        while consumed < max_tokens:
            room = n_ctx - 1 - n_past  # positions left after id_last's
            if room < 0:
                state.finish_reason = "length"
                return
            # (one verification batch: id_last and the drafts must fit n_batch)
            n_draft = n_limit = min(proposer.n_max, room, max_tokens - consumed - 1, n_batch_limit)
            if controller is not None and n_limit > 0:
                n_draft = max(0, min(n_limit, controller.choose(n_limit)))
                if n_draft == 0 and shadow_probe is not None:
                    n_shadow = min(shadow_probe(), n_limit)
                    if n_shadow > 0 and shadow is None:
                        shadow = _start_shadow(proposer, id_last, n_past, n_shadow, stats)
            t0 = time.perf_counter()
            draft = proposer.propose(id_last, n_past, n_draft, history=history) if n_draft > 0 else []
            t1 = time.perf_counter()
            batch = [id_last, *draft]
            if before_verify is not None:
                before_verify(n_past, batch)
            ids = _verify_and_accept(target, proposer, sampler, batch, n_past, stats, feeds, is_eog)
            n_ids = len(ids)
            proposer.accept(n_ids - 1)
            history.append(id_last)
            if n_ids > 1:
                history.extend(ids[:-1])
            n_past += n_ids
            state.n_past = n_past
            # only a rejection leaves cells to drop (the draft removes its own block's cells)
            if n_ids <= len(draft) and _rewind(rewinder, proposer, n_past) != n_past:
                raise LlamaCallError(f"the target cache could not be rolled back to position {n_past}")
            if controller is not None:
                controller.observe(len(draft), n_ids - 1, t1 - t0, time.perf_counter() - t1)
            if shadow is not None and shadow.feed(ids, controller, stats):
                shadow = None
            for tok in ids:
                if is_eog[tok]:
                    state.finish_reason = "stop"
                    return
                if consumed == 0:
                    stats.first_token_seconds = time.perf_counter() - t_start
                state.tokens.append(tok)
                consumed += 1
                stats.generated_tokens += 1
                yield tok
                if consumed >= max_tokens:
                    break
            id_last = ids[-1]
        state.finish_reason = "length"
    finally:
        stats.total_seconds = time.perf_counter() - t_start
        report = getattr(proposer, "report", None)  # a chain's per-speculator counts
        if report is not None:
            report(stats)
        # tokens decoded beyond what the consumer took must not stay in either cache (a generator
        # finalised after its engine was closed has no cache left to touch)
        if not target.closed:
            keep = len(prompt) - 1 + consumed
            if keep < n_past:
                state.n_past = _rewind(rewinder, proposer, keep)
            rewinder.settle()


def _start_shadow(proposer: Proposer, id_last: int, n_past: int, n: int, stats: SpecStats) -> Optional[ShadowProbe]:
    tokens = proposer.propose(id_last, n_past, n, shadow=True)
    stats.shadow_probes += 1
    return ShadowProbe(tokens) if tokens else None


def _count_target(stats: SpecStats, t0: float, t_sync: float, t1: float) -> None:
    """A target step's time: llama_decode from t0 (on a GPU it returns before the work is done),
    then waiting for its first logits until t1."""
    stats.target_decode_seconds += t_sync - t0
    stats.target_sync_seconds += t1 - t_sync
    stats.target_seconds += t1 - t0


def _verify_and_accept(
    target: TargetContext,
    proposer: Proposer,
    sampler: Sampler,
    batch: list[int],
    n_past: int,
    stats: SpecStats,
    feeds: bool = True,
    is_eog: Optional[Callable[[int], bool]] = None,
) -> list[int]:
    """Decode batch = [id_last, *draft] with logits on every row; sample rows until one disagrees."""
    t0 = time.perf_counter()
    target.decode(batch, n_past, logits="all")
    t_sync = time.perf_counter()
    ctx = target.ctx.ptr
    if not logits_ith_addr(ctx, 0):  # the first read synchronises with the device
        raise LlamaCallError("no logits for batch row 0")
    t1 = time.perf_counter()
    _count_target(stats, t0, t_sync, t1)
    eog = is_eog.__getitem__ if isinstance(is_eog, dict) else (is_eog or target.model.is_eog)
    n_draft = len(batch) - 1
    ids: list[int] = []
    sample = sampler.sample
    for i in range(n_draft + 1):
        tok = sample(ctx, i)
        ids.append(tok)
        # an end-of-generation sample ends the step, as llama.cpp's verification does: nothing
        # after it is accepted (its row would condition on text past the end)
        if i == n_draft or tok != batch[i + 1] or eog(tok):
            break
    t2 = time.perf_counter()
    stats.sample_seconds += t2 - t1
    n_accepted = len(ids) - 1
    stats.record_step(n_draft, n_accepted)
    # only the rows that stay in the target cache feed the draft: id_last and accepted drafts
    if feeds:
        proposer.inject(target.layer_features(n_accepted + 1), n_past)
    return ids


def _rewind(rewinder: Rewinder, proposer: Proposer, n_past: int) -> int:
    """Keep positions < n_past on both contexts; returns what was kept (0: both caches were
    emptied because the target could not go back that far)."""
    kept = rewinder.rewind(n_past)
    if kept == n_past:
        proposer.rollback(n_past)
    else:
        proposer.clear()
    return kept
