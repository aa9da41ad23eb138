"""Token samplers shared by the ordinary and the speculative loop.

Verification samples each target row with the same sampler ordinary decoding uses, and accepts
a draft token only when the sample equals it.  For greedy sampling that reproduces ordinary
decoding exactly; for temperature > 0 every emitted token is still a sample from the target's
own distribution at that position, so the output distribution is unchanged (the draft only
decides how many rows are computed in one batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SamplingParams", "Sampler"]


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, not {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, not {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), not {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class Sampler:
    """Picks a token from one row of logits; greedy is a plain argmax (no copy of the row)."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self._rng = np.random.default_rng(self.params.seed)

    def reset(self) -> None:
        self._rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / p.temperature
        if p.top_k and p.top_k < scaled.size:
            idx = np.argpartition(scaled, -p.top_k)[-p.top_k :]
        else:
            idx = np.arange(scaled.size)
        vals = scaled[idx]
        order = np.argsort(-vals, kind="stable")
        idx, vals = idx[order], vals[order]
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = probs.size
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p) + 1))
        keep = max(keep, 1)
        probs = probs[:keep] / probs[:keep].sum()
        return int(idx[self._rng.choice(keep, p=probs)])
