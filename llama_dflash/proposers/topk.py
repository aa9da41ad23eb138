"""The draft token of one row of logits, as llama.cpp's drafters pick it.

Its driver (common/speculative.cpp) samples every draft row with a top-10 sampler chain and takes
the first candidate: the top token, with a probability that is a softmax over those 10 logits
only.  That probability is what `p_min` cuts on, so it is computed only where a cut can happen.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CANDIDATES", "top_candidate"]

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
