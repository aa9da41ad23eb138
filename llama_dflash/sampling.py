"""Token sampling through llama.cpp's own sampler chain, shared by the ordinary and the speculative loop.

Why speculative sampling here is lossless
-----------------------------------------
Verification decodes ``[id_last, d1..dk]`` in one target batch, so row i holds the target's
logits for the position after ``d1..di`` -- exactly the logits ordinary decoding would compute
there *if* ``d1..di`` were the tokens it had emitted.  The loop samples row 0 with the same
sampler chain ordinary decoding uses and continues to row i+1 only while the sample equals the
draft token ``d(i+1)``.  Every emitted token is therefore a fresh sample from the target's own
(processed) distribution conditioned on the tokens emitted before it; the draft only decides how
many of those conditionals are computed in one batch.  By induction over positions the emitted
sequence is distributed exactly as with ordinary decoding ("rejection by exact match": it needs
no draft probabilities and is never biased).

The chain is llama.cpp's (``llama_sampler_chain_*``), built in the order llama-cpp-python builds
it: penalties, then greedy, or top-k / typical / top-p / min-p / temperature / dist(seed).
``llama_sampler_sample`` accepts every sampled token into the chain, and the loops sample rows
only up to the first mismatch, so the chain's state -- penalty window, random stream -- advances
once per emitted token, exactly as in ordinary decoding: the same seed gives the same text with
or without a draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from llama_cpp import llama_cpp as ll

from ._batch import logits_ith_addr
from ._llama import _Handle
from .target import float_view

__all__ = ["SamplingParams", "Sampler", "RANDOM_SEED"]

#: llama.cpp's "pick a random seed" value (LLAMA_DEFAULT_SEED)
RANDOM_SEED = 0xFFFFFFFF


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    return float(value)


@dataclass
class SamplingParams:
    """Sampling settings, with llama.cpp's meaning.

    Penalties (llama.cpp's ``penalties`` sampler): over the last ``penalty_last_n`` sampled
    tokens (0 disables; passed to llama.cpp as given, like llama-cpp-python does), a seen token's logit is divided by
    ``repeat_penalty`` when positive and multiplied by it otherwise, then reduced by
    ``frequency_penalty * count + presence_penalty``.  ``temperature == 0`` is greedy.
    ``seed=None`` draws a random seed.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    seed: Optional[int] = 0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
                     "frequency_penalty"):
            setattr(self, name, _finite(name, getattr(self, name)))
        if self.repeat_penalty <= 0.0:
            raise ValueError(f"repeat_penalty must be > 0, not {self.repeat_penalty}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, not {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, not {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], not {self.min_p}")
        if isinstance(self.penalty_last_n, bool) or not isinstance(self.penalty_last_n, int) \
                or self.penalty_last_n < -1:
            raise ValueError(f"penalty_last_n must be an integer >= -1, not {self.penalty_last_n!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, not {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler(_Handle):
    """Owns one llama.cpp sampler chain; `sample(ctx, i)` picks the token of batch row i.

    `banned` tokens get a logit bias of -inf (``ignore_eos``: end-of-generation tokens can never
    be sampled, as llama.cpp's ``--ignore-eos`` does).
    """

    def __init__(self, params: Optional[SamplingParams] = None, *, n_vocab: int, banned: Sequence[int] = ()):
        super().__init__()
        self.params = p = params or SamplingParams()
        # plain greedy (no penalties) is the row's first maximum, which is all llama.cpp's greedy
        # sampler computes -- read straight from its buffer, no candidate array; only when that
        # maximum is a banned token does the chain (with its -inf bias) decide
        no_penalty = p.penalty_last_n == 0 or (p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0
                                                and p.presence_penalty == 0.0)
        self._argmax = p.greedy and no_penalty
        self._banned = frozenset(int(t) for t in banned)  # the argmax path falls back to the chain
        self._n_vocab = n_vocab
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if not chain:
            raise MemoryError("llama_sampler_chain_init failed")
        self._own(chain, ll.llama_sampler_free)  # frees the samplers the chain owns
        if banned:
            bias = (ll.llama_logit_bias * len(banned))()
            for i, tok in enumerate(banned):
                bias[i].token = int(tok)
                bias[i].bias = -math.inf
            self._add(ll.llama_sampler_init_logit_bias(n_vocab, len(banned), bias))
        self._add(ll.llama_sampler_init_penalties(n_vocab, p.penalty_last_n, p.repeat_penalty,
                                                  p.frequency_penalty, p.presence_penalty))
        if p.greedy:
            self._add(ll.llama_sampler_init_greedy())
        else:
            seed = RANDOM_SEED if p.seed is None else p.seed & 0xFFFFFFFF
            self._add(ll.llama_sampler_init_top_k(p.top_k))
            self._add(ll.llama_sampler_init_typical(p.typical_p, 1))
            self._add(ll.llama_sampler_init_top_p(p.top_p, 1))
            self._add(ll.llama_sampler_init_min_p(p.min_p, 1))
            self._add(ll.llama_sampler_init_temp(p.temperature))
            self._add(ll.llama_sampler_init_dist(seed))

    def _add(self, sampler: int) -> None:
        if not sampler:
            self.close()
            raise MemoryError("llama.cpp could not create a sampler")
        ll.llama_sampler_chain_add(self.ptr, sampler)

    def sample(self, ctx: int, i: int) -> int:
        """Sample batch row i of the context's last decode and accept it into the chain."""
        chain = self.ptr  # RuntimeError once closed
        if self._argmax:
            addr = logits_ith_addr(ctx, i)
            if addr:
                tok = int(float_view(addr, (self._n_vocab,)).argmax())
                if tok not in self._banned:
                    return tok
        return int(ll.llama_sampler_sample(chain, ctx, i))

