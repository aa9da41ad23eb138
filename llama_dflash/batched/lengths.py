"""The draft length of a batched step, chosen from the measured cost of whole steps.

A step of R sequences that each verify k drafts decodes R*(k+1) target rows and one draft decode of
R blocks; both costs depend on R (on a 2-core CPU a wide batch costs several single decodes, on a
GPU nearly one).  So the cost curve is learnt per R: one `AdaptiveController` per batch width, all
sharing one acceptance model (the same draft drafts for every sequence).  Expected tokens of the
step are R times one sequence's, so the k that maximises one sequence's tokens per second of the
whole step maximises the batch's: speculation is chosen only where the measured costs say the
batch gains from it, and the controllers' probes keep measuring when it does not.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..adaptive import AcceptanceModel, AdaptiveController

__all__ = ["StepLengths"]


class StepLengths:
    """`choose(R)` -> k for a step of R sequences; `observe` what the step cost and accepted.
    `fixed`: always k (a SpecConfig with a draft_n_max number)."""

    def __init__(self, n_max: int, fixed: Optional[int] = None):
        self.n_max = n_max
        self.fixed = None if fixed is None else min(int(fixed), n_max)
        self.acceptance = AcceptanceModel(n_max)
        self._by_width: dict[int, AdaptiveController] = {}

    def controller(self, n_running: int) -> AdaptiveController:
        ctrl = self._by_width.get(n_running)
        if ctrl is None:
            ctrl = self._by_width[n_running] = AdaptiveController(self.n_max)
            ctrl.acceptance = self.acceptance
        return ctrl

    def choose(self, n_running: int) -> int:
        if self.fixed is not None:
            return self.fixed
        return self.controller(n_running).choose(self.n_max)

    def observe(self, n_running: int, k: int, accepted: Sequence[int], draft_seconds: float,
                verify_seconds: float) -> None:
        if self.fixed is not None:
            return
        self.controller(n_running).observe_many(k, accepted, draft_seconds, verify_seconds)

    def summary(self) -> dict[str, object]:
        """Per batch width: the measured seconds per step for each k tried (for /metrics and tests)."""
        return {str(r): {str(k): v for k, v in c.costs.curve().items()} for r, c in sorted(self._by_width.items())}
