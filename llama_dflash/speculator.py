"""`Speculator`: the draft side of `llama_dflash.Llama`, attached to a llama_cpp.Llama's own context.

llama-cpp-python's `Llama.generate` already verifies drafts: after each sampled token it asks its
`draft_model(input_ids)` for tokens, evaluates ``[token, *drafts]`` in one batch, samples the rows
one by one with its sampler chain and, at the first sample that differs from a draft, cuts its
cache back.  A `Speculator` is that draft model for a DFlash/DSpark draft GGUF.  What the base
class cannot do for it, `llama_dflash.Llama.eval` does: capture the target's layer inputs after
every decode and hand them here (`on_decoded`), and take the target cache back through the
recurrent-state strategies of `rewind` where a plain cut does not work.

Bookkeeping of the draft cache: positions ``[0, draft_end)`` hold injected target features.
Features of rows that are still drafts when they are decoded (a verification batch) wait in
``_pending`` until the next call says how many of them were accepted (`commit`): the committed
length is always ``len(input_ids) - 1`` at a draft call, ``Llama.n_tokens`` at an eval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .adaptive import AdaptiveController, ShadowProbe
from .proposers import DFlashProposer, Proposer
from .rewind import Rewinder
from .stats import SpecStats
from .target import TargetContext

__all__ = ["Speculator"]


@dataclass
class _Block:
    """The last proposal: where it starts, what it drafted, and what it cost."""

    pos0: int
    tokens: list[int]
    draft_seconds: float
    verified: bool = False
    verify_seconds: float = 0.0


class Speculator:
    """Draft proposals for `llama_cpp.Llama.generate` (its `draft_model` interface).

    Owns the draft model's proposer (its context and model), if any, the other models in `owned`
    (the target's MTP head) and the rewinder; borrows the target.  `proposer` is the draft model
    itself, or a chain / `auto` of token drafters (n-gram, lookup) with the draft model (`draft`)
    as a member or without one (`draft` None).
    """

    def __init__(self, target: TargetContext, proposer: Proposer, rewinder: Rewinder,
                 controller: Optional[AdaptiveController], stats: SpecStats, *, max_positions: int = 0,
                 draft: Optional[Proposer] = None, owned: Sequence[Proposer] = ()):
        self.target = target
        self.owned = tuple(owned)  # further models it owns (the target's MTP head)
        self.max_positions = max_positions or target.n_ctx
        # the draft model (DFlash/DSpark, EAGLE-3 head, classic draft: stats, cache state); None:
        # token drafters only
        self.draft: Optional[Proposer] = draft if draft is not None else (
            proposer if isinstance(proposer, DFlashProposer) else None)
        self.proposer: Proposer = proposer  # what proposes: the draft, a chain, or a test's scripted wrapper
        # a drafter without a model reads no features, so drafting needs no injected prefix
        self._needs_features = bool(getattr(proposer, "needs_features", True))
        self._begin_pending = True  # the next draft call starts a generation (proposer.begin)
        self.rewinder = rewinder
        self.controller = controller
        self.stats = stats
        self.draft_end = 0
        self._pending: Optional[tuple[np.ndarray, int]] = None
        self._block: Optional[_Block] = None
        # a probe drafted without verification (controller.shadow_probes) and the position of the
        # next committed token it has not been scored against yet
        self._shadow: Optional[tuple[ShadowProbe, int]] = None

    # ---- the draft_model interface of llama_cpp.Llama.generate -----------------------------------
    def __call__(self, input_ids: np.ndarray) -> np.ndarray:
        """Draft tokens to follow `input_ids` (the committed sequence plus the token just sampled)."""
        n_past = len(input_ids) - 1
        self._finish_block(n_past)
        self._score_shadow(input_ids)
        self.commit(n_past)
        self.rollback(n_past)
        history = input_ids[:-1]
        if self._begin_pending:
            self._begin_pending = False
            self.proposer.begin(history)
        n = min(self.proposer.n_max, self.max_positions - 1 - n_past, self.target.ctx.n_batch - 1)
        if (self._needs_features and self.draft_end != n_past) or n <= 0:
            # features missing (restored state): no draft
            self._block = _Block(n_past, [], 0.0)
            return np.zeros(0, dtype=np.intc)
        if self.controller is not None:
            n_limit, n = n, max(0, min(n, self.controller.choose(n)))
            if n == 0:
                self._start_shadow(int(input_ids[-1]), n_past, min(self.controller.shadow_probe(), n_limit),
                                   history)
        t0 = time.perf_counter()
        draft = self.proposer.propose(int(input_ids[-1]), n_past, n, history=history) if n > 0 else []
        self._block = _Block(n_past, list(draft), time.perf_counter() - t0)
        return np.asarray(draft, dtype=np.intc)

    def _start_shadow(self, id_last: int, n_past: int, n: int, history: Sequence[int] = ()) -> None:
        if n <= 0 or self._shadow is not None:
            return
        tokens = self.proposer.propose(id_last, n_past, n, shadow=True, history=history)
        self.stats.shadow_probes += 1
        if tokens:
            self._shadow = (ShadowProbe(tokens), n_past + 1)

    def _score_shadow(self, input_ids: np.ndarray) -> None:
        """Score the shadow probe against the tokens committed since the last call."""
        if self._shadow is None or self.controller is None:
            return
        shadow, pos = self._shadow
        if len(input_ids) < pos:  # the sequence went back: the probe is moot
            self._shadow = None
            return
        if shadow.feed([int(t) for t in input_ids[pos:]], self.controller, self.stats):
            self._shadow = None
        else:
            self._shadow = (shadow, len(input_ids))

    def block_for(self, tokens: Sequence[int], pos0: int) -> int:
        """How many of `tokens` (evaluated at pos0) are the last proposal's drafts (0: none)."""
        b = self._block
        if b is None or b.verified or b.pos0 != pos0 or not b.tokens or len(tokens) < 2:
            return 0
        k = len(tokens) - 1
        return k if list(tokens[1:]) == b.tokens[:k] else 0

    def before_verify(self, pos0: int, tokens: Sequence[int]) -> None:
        self.rewinder.before_verify(pos0, tuple(tokens))

    def verified(self, seconds: float) -> None:
        if self._block is not None:
            self._block.verified = True
            self._block.verify_seconds = seconds

    def _finish_block(self, n_committed: int) -> None:
        """Score the last proposal now that the committed length says what was accepted."""
        b, self._block = self._block, None
        if b is None:
            return
        if not b.tokens:  # a step without a draft: drafters hear it, as llama.cpp's do
            self.proposer.accept(0)
            return
        if not b.verified:
            return
        k = len(b.tokens)
        accepted = max(0, min(k, n_committed - b.pos0 - 1))
        self.stats.record_step(k, accepted)  # (the proposer counts drafted tokens and draft steps)
        self.proposer.accept(accepted)
        report = getattr(self.proposer, "report", None)  # a chain's per-speculator counts
        if report is not None:
            report(self.stats)
        if self.controller is not None:
            self.controller.observe(k, accepted, b.draft_seconds, b.verify_seconds)

    # ---- draft cache -----------------------------------------------------------------------------
    def on_decoded(self, features: np.ndarray, pos0: int, n_sure: int) -> None:
        """Features of target rows decoded at pos0..: the first n_sure rows stay in the target
        cache; the rest are drafts whose fate the next `commit` decides."""
        self._pending = None
        if pos0 != self.draft_end:
            return  # out of sync: drafting stays off until a decode from the start
        if n_sure:
            self.proposer.inject(features[:n_sure], pos0)
            self.draft_end = pos0 + n_sure
        if n_sure < features.shape[0]:
            self._pending = (features[n_sure:], pos0 + n_sure)

    def commit(self, n_committed: int) -> None:
        """Inject the pending draft rows that turned out accepted (positions < n_committed)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        feats, pos0 = pending
        m = min(feats.shape[0], n_committed - pos0)
        if pos0 == self.draft_end and m > 0:
            self.proposer.inject(feats[:m], pos0)
            self.draft_end = pos0 + m

    def rollback(self, n_keep: int) -> None:
        if self.draft_end > n_keep:
            self.proposer.rollback(n_keep)
            self.draft_end = n_keep

    def clear(self) -> None:
        self._pending = None
        self._block = None
        self._shadow = None
        self.proposer.clear()
        self.draft_end = 0

    def use_stats(self, stats: SpecStats) -> None:
        """Count the next generation into `stats` (every part that records anything); a shadow
        probe the last generation left unscored is dropped."""
        self._shadow = None
        self._begin_pending = True
        self.stats = self.rewinder.stats = stats
        for part in (self.draft, self.proposer, *self.owned):
            if part is not None and hasattr(part, "stats"):
                part.stats = stats
        if self.controller is not None:
            self.controller.stats = stats

    def use_proposer(self, proposer: Proposer) -> None:
        """Propose with another proposer over the same draft cache (e.g. a ScriptedProposer)."""
        self.proposer = proposer

    def close(self) -> None:
        self.rewinder.close()
        for model in (*self.owned, self.draft):
            if model is not None:
                model.close()
        self.target.close()  # borrowed context: frees only our batch
