"""Token samplers shared by the ordinary and the speculative loop.

Why speculative sampling here is lossless
-----------------------------------------
Verification decodes ``[id_last, d1..dk]`` in one target batch, so row i holds the target's
logits for the position after ``d1..di`` -- exactly the logits ordinary decoding would compute
there *if* ``d1..di`` were the tokens it had emitted.  The loop then samples row 0 with the same
sampler ordinary decoding uses and continues to row i+1 only while the sample equals the draft
token ``d(i+1)``.  Every emitted token is therefore a fresh sample from the target's own
(processed) distribution conditioned on the tokens emitted before it; the draft only decides how
many of those conditionals are computed in one batch.  By induction over positions, the joint
distribution of the emitted sequence equals that of ordinary decoding (for greedy sampling the
sequence itself is identical, up to floating-point differences between batch shapes).  This is
"rejection by exact match", simpler than the Leviathan et al. ratio test and, unlike it, needs no
draft probabilities; it accepts less often for flat distributions but is never biased.

The sampler keeps the tokens it has sampled (``history``).  Because the loop stops sampling at
the first mismatch, that history is always the committed sequence, which is what the repetition,
presence and frequency penalties need; they therefore stay lossless too.  The random stream is
also consumed one draw per emitted token in both loops, so the same seed gives the same output
whether or not the draft agrees (up to batch-shape floating-point effects).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

__all__ = ["SamplingParams", "Sampler", "LogitsHook"]

#: ``hook(generated_tokens, logits) -> logits``: sees the tokens sampled so far in this generation
LogitsHook = Callable[[Sequence[int], np.ndarray], np.ndarray]


@dataclass
class SamplingParams:
    """Sampling settings.

    The penalties follow llama.cpp's ``penalties`` sampler (as llama-cpp-python configures it):
    over the last ``penalty_last_n`` generated tokens, a logit of a token seen there is divided by
    ``repeat_penalty`` when positive and multiplied by it otherwise, then reduced by
    ``frequency_penalty * count + presence_penalty``.  ``penalty_last_n = -1`` uses the whole
    history, 0 disables the penalties.

    ``temperature_last`` applies top-k/top-p/min-p to the untempered distribution and the
    temperature afterwards, as llama.cpp's sampler chain (and llama-cpp-python) does; the default
    applies the temperature first.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = 0  # None: nondeterministic
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    temperature_last: bool = False
    logits_hook: Optional[LogitsHook] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, not {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, not {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), not {self.min_p}")
        if not self.repeat_penalty > 0.0:
            raise ValueError(f"repeat_penalty must be > 0, not {self.repeat_penalty}")
        if self.penalty_last_n < -1:
            raise ValueError(f"penalty_last_n must be >= -1, not {self.penalty_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        return self.penalty_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )


class Sampler:
    """Picks a token from one row of logits and remembers it (the history feeds the penalties).

    Greedy sampling without penalties or hook is a plain argmax (no copy of the row).
    """

    def __init__(self, params: SamplingParams | None = None, history: Sequence[int] = ()):
        self.params = params or SamplingParams()
        self._rng = np.random.default_rng(self.params.seed)
        self.history: list[int] = [int(t) for t in history]

    def reset(self, history: Sequence[int] = ()) -> None:
        self._rng = np.random.default_rng(self.params.seed)
        self.history = [int(t) for t in history]

    def _window(self) -> Sequence[int]:
        n = self.params.penalty_last_n
        return self.history if n < 0 else self.history[-n:]

    def processed_logits(self, logits: np.ndarray) -> np.ndarray:
        """The row after the logits hook and the penalties (a float64 copy when either applies)."""
        p = self.params
        row = logits
        if p.logits_hook is not None:
            row = np.asarray(p.logits_hook(list(self.history), np.array(row, dtype=np.float32)), dtype=np.float64)
        if p.penalized and self.history:
            row = np.array(row, dtype=np.float64)
            counts = Counter(self._window())
            ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            cnt = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            vals = row[ids]
            if p.repeat_penalty != 1.0:
                vals = np.where(vals <= 0.0, vals * p.repeat_penalty, vals / p.repeat_penalty)
            vals = vals - cnt * p.frequency_penalty - p.presence_penalty
            row[ids] = vals
        return row

    def __call__(self, logits: np.ndarray) -> int:
        tok = self._pick(self.processed_logits(logits))
        self.history.append(tok)
        return tok

    def _pick(self, logits: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        base = logits.astype(np.float64)
        scaled = base if p.temperature_last else base / p.temperature
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
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p) + 1))
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        keep = max(keep, 1)
        if p.temperature_last:
            t = vals[:keep] / p.temperature
            probs = np.exp(t - t[0])
        else:
            probs = probs[:keep]
        probs = probs / probs.sum()
        return int(idx[self._rng.choice(keep, p=probs)])
