"""Per-token log-probabilities for the high-level `Llama`, without touching the generation loops.

llama-cpp-python computes completion logprobs from ``Llama.scores``: row ``p`` holds the target's
raw logits after position ``p``, i.e. the distribution the token at position ``p + 1`` was drawn
from.  Both of our loops (ordinary and speculative) call the `Sampler` exactly once per row they
sample, in order, and the tokens they hand out are a prefix of the samples: a rejected draft
position's sample *is* the emitted token, and only samples past the consumer's stop (EOG,
max_tokens) go unused.  So the k-th call of the sampler's logits hook sees the row of the k-th
generated token, and `ScoreRecorder` -- installed as that hook only when logprobs were asked
for -- copies it to ``scores[len(prompt) - 1 + k]``; llama-cpp-python's own code then turns the
rows into the response's ``logprobs`` (log-softmax, top-N, text offsets, streaming chunks).

Without logprobs nothing is installed: no hook, no copy of any row (greedy sampling stays a plain
argmax of the llama.cpp buffer).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .sampling import LogitsHook

__all__ = ["ScoreRecorder"]


class ScoreRecorder:
    """A `SamplingParams.logits_hook` that stores each raw row it sees, then applies `inner`.

    The Sampler hands the hook a fresh float32 copy of the raw row, before penalties; the stored
    row is therefore exactly what llama.cpp computed.  `inner` (the caller's logits processors)
    gets its own copy, so a processor that edits in place cannot alter the stored row.
    """

    def __init__(self, scores: np.ndarray, offset: int, inner: Optional[LogitsHook] = None):
        self.scores = scores
        self.offset = int(offset)
        self.inner = inner
        self.n_rows = 0  # rows seen so far (= tokens sampled so far)

    def __call__(self, generated: Sequence[int], logits: np.ndarray) -> np.ndarray:
        i = self.offset + self.n_rows
        if 0 <= i < self.scores.shape[0]:
            self.scores[i, :] = logits
        self.n_rows += 1
        if self.inner is not None:
            return self.inner(generated, np.array(logits, copy=True))
        return logits
