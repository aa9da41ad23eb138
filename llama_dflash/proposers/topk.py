"""The draft token of one row of logits, as llama.cpp's drafters pick it, and the end of a draft.

Its driver (common/speculative.cpp) samples every draft row with a top-10 sampler chain and takes
the first candidate: the top token, with a probability that is a softmax over those 10 logits
only.  That probability is what `p_min` cuts on, so it is computed only where a cut can happen.
Its autoregressive drafters (draft-simple, draft-eagle3, draft-mtp) draft up to their n_max, drop
a draft shorter than n_min, and only then cut it to the step's budget (`finish_draft`).
"""

from __future__ import annotations

import time

import numpy as np

from .._batch import logits_ith_addr
from ..errors import LlamaCallError
from ..stats import SpecStats
from ..target import float_view

__all__ = ["CANDIDATES", "top_candidate", "row_logits", "draft_length", "finish_draft"]

CANDIDATES = 10


def top_candidate(logits: np.ndarray, with_prob: bool) -> tuple[int, float]:
    """The top token of `logits` (the lowest id among equal logits) and, if `with_prob`, its
    probability over the top CANDIDATES logits (else 1.0)."""
    tok = int(np.argmax(logits))
    if not with_prob:
        return tok, 1.0
    k = min(CANDIDATES, logits.shape[0])
    cand = logits[np.argpartition(logits, -k)[-k:]]
    return tok, float(1.0 / np.exp(cand - logits[tok]).sum())


def row_logits(ctx: int, i: int, n_vocab: int, who: str) -> np.ndarray:
    """A zero-copy view of output row i's logits of the last decode on `ctx`."""
    ptr = logits_ith_addr(ctx, i)
    if not ptr:
        raise LlamaCallError(f"{who} produced no logits for row {i}")
    return float_view(ptr, (n_vocab,))


def draft_length(n: int, n_max: int, n_min: int) -> int:
    """Tokens to draft for a budget of n: past n only as far as n_min needs (llama.cpp decides
    n_min on the uncut draft)."""
    return min(n_max, max(n, n_min))


def finish_draft(stats: SpecStats, tokens: list[int], n: int, n_min: int, t0: float, shadow: bool) -> list[int]:
    """llama.cpp's end of a draft: none if shorter than n_min, then cut to the budget n; the
    draft's time and tokens counted (a shadow probe's apart)."""
    if len(tokens) < n_min:
        tokens = []
    tokens = tokens[:n]
    stats.draft_seconds += time.perf_counter() - t0
    stats.draft_steps += 1
    if shadow:
        stats.shadow_drafted += len(tokens)
    else:
        stats.drafted += len(tokens)
    return tokens
