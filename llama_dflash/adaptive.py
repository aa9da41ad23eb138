"""Adaptive draft length: choose, every step, the number of draft tokens that maximises tokens/s.

The draft always decodes its whole block (see BLOCK SEMANTICS in `proposer`); k is how many of
that block's tokens are verified.  Expected tokens from drafting k is
`1 + sum_{j<=k} prod_{i<=j} p_i` (the target always adds one token), where p_i is the online
conditional acceptance of slot i of that block.  Its cost is the measured time of verifying
k+1 rows plus the draft step (the same block for every k > 0; measured per k all the same).  k = 0 is ordinary decoding; while speculation does not
pay, the controller probes with a short draft now and then (less often after each failed probe)
so it resumes when the text becomes predictable.  With `shadow_probes` (the engine's own loop) a
probe is not verified: the loop drafts the probe's tokens, decodes ordinarily, and reports with
`observe_shadow` how many of them the target went on to produce, which under greedy decoding is
exactly what verifying them would have accepted; a probe then costs one draft block instead of a
wide verification (on a 2-core CPU ~0.2 instead of ~1.5 extra decodes).  Once a shadow probe is
accepted whole, the probes that follow are verified again: they earn their tokens and measure the
deeper slots in one step each, so speculation resumes as fast as without shadows.

Costs are measured, not assumed: on a 2-core CPU verifying 8 rows costs ~5 single decodes, on a
GPU nearly one.  Tests inject fixed cost curves instead.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from .stats import SpecStats

__all__ = ["CostModel", "FixedCosts", "AcceptanceModel", "AdaptiveController", "ShadowProbe"]


class CostModel:
    """Smoothed wall time of verification (k+1 rows) and drafting (k tokens) per k.

    Unmeasured k are filled in from a least-squares line through the measured ones.
    """

    def __init__(self, alpha: float = 0.15):
        self.alpha = alpha
        self._verify: dict[int, float] = {}
        self._draft: dict[int, float] = {}
        self.samples: dict[int, int] = {}
        self._fits: dict[str, Optional[tuple[float, float, float]]] = {}  # cached until the next observe

    def observe(self, k: int, draft_seconds: float, verify_seconds: float) -> None:
        n = self.samples.get(k, 0)
        a = 1.0 if n == 0 else max(self.alpha, 1.0 / (n + 1))
        self._verify[k] = (1 - a) * self._verify.get(k, 0.0) + a * verify_seconds
        if k > 0:
            self._draft[k] = (1 - a) * self._draft.get(k, 0.0) + a * draft_seconds
        self.samples[k] = n + 1
        self._fits.clear()

    def _fit(self, points: dict[int, float]) -> Optional[tuple[float, float, float]]:
        """A line my + slope*(k - mx) (slope >= 0) through the per-k averages, weighted by their
        sample counts; None without points.

        Using the fit for every k, measured or not, keeps noise from making a longer block look
        cheaper than a shorter one.
        """
        if not points:
            return None
        if len(points) == 1:
            return next(iter(points.values())), 0.0, 0.0
        w = {x: min(20, self.samples.get(x, 1)) for x in points}
        sw = sum(w.values())
        mx = sum(w[x] * x for x in points) / sw
        my = sum(w[x] * y for x, y in points.items()) / sw
        var = sum(w[x] * (x - mx) ** 2 for x in points)
        slope = sum(w[x] * (x - mx) * (y - my) for x, y in points.items()) / var if var else 0.0
        return my, max(0.0, slope), mx

    def _estimate(self, which: str, k: int) -> Optional[float]:
        """Measured lengths read their own (smoothed) cost, made non-decreasing in k; lengths in
        between are interpolated, longer ones extrapolated with the fitted slope.

        A single line through all lengths misjudged the short ones: on a CPU one row and two are
        different kernels (mat-vec, then mat-mat), so the cost curve is steep from k = 0 to 1 and
        flatter after; a line fitted mostly on long lookup drafts called a 1-token verification
        1.5 single decodes where it measured 1.9, and `auto` drafted 1-token guesses that lost.
        The running maximum keeps noise from making a longer block look cheaper."""
        if which not in self._fits:  # rebuilt once per observation, not once per k asked
            points = self._verify if which == "verify" else self._draft
            fit = self._fit(points)
            xs = sorted(points)
            ys, top = [], 0.0
            for x in xs:
                top = max(top, points[x])
                ys.append(top)
            self._fits[which] = None if fit is None else (xs, ys, fit[1])  # type: ignore[assignment]
        table = self._fits[which]
        if table is None:
            return None
        xs, ys, slope = table  # type: ignore[misc]
        i = bisect_left(xs, k)
        if i < len(xs) and xs[i] == k:
            return max(1e-9, ys[i])
        if i == 0:  # below every measured length: the shortest one's cost
            return max(1e-9, ys[0])
        if i == len(xs):
            return max(1e-9, ys[-1] + slope * (k - xs[-1]))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(1e-9, y0 + (y1 - y0) * (k - x0) / (x1 - x0))

    def verify_time(self, k: int) -> Optional[float]:
        return self._estimate("verify", k)

    def draft_time(self, k: int) -> Optional[float]:
        return 0.0 if k == 0 else self._estimate("draft", k)

    def known(self, k: int) -> bool:
        return k in self._verify

    def curve(self) -> dict[int, float]:
        """Measured seconds per step (verify + draft) for every k seen."""
        return {k: self._verify[k] + self._draft.get(k, 0.0) for k in sorted(self._verify)}


@dataclass
class FixedCosts:
    """A known cost curve (seconds) for deterministic tests: verify(k) for k+1 rows, draft(k)."""

    verify: Callable[[int], float]
    draft: Callable[[int], float]
    samples: dict[int, int] = field(default_factory=dict)

    def observe(self, k: int, draft_seconds: float, verify_seconds: float) -> None:
        self.samples[k] = self.samples.get(k, 0) + 1

    def verify_time(self, k: int) -> float:
        return self.verify(k)

    def draft_time(self, k: int) -> float:
        return 0.0 if k == 0 else self.draft(k)

    def known(self, k: int) -> bool:
        return True

    def curve(self) -> dict[int, float]:
        return {k: self.verify(k) + self.draft_time(k) for k in sorted(self.samples)}


class AcceptanceModel:
    """Per-slot conditional acceptance p_i = P(slot i accepted | slots < i accepted), decayed."""

    def __init__(self, n_max: int, decay: float = 0.9, prior: float = 0.5, prior_weight: float = 1.0):
        self.decay = decay
        self.prior = prior
        self.prior_weight = prior_weight
        self.trials = [0.0] * n_max
        self.hits = [0.0] * n_max

    def observe(self, n_draft: int, n_accepted: int) -> None:
        # slots 0..n_accepted were tried (the first rejected one included); 0..n_accepted-1 hit
        for i in range(min(n_draft, n_accepted + 1)):
            self.trials[i] = self.decay * self.trials[i] + 1.0
            self.hits[i] = self.decay * self.hits[i] + (1.0 if i < n_accepted else 0.0)

    def p(self, i: int) -> float:
        return (self.hits[i] + self.prior * self.prior_weight) / (self.trials[i] + self.prior_weight)

    def expected_tokens(self, k: int) -> float:
        """1 + sum_{j=1..k} prod_{i<=j} p_i."""
        total, run = 1.0, 1.0
        for i in range(k):
            run *= self.p(i)
            total += run
        return total


class AdaptiveController:
    """Implements generate.DraftController; keep one per engine so later calls start warm."""

    def __init__(self, n_max: int, costs: Optional[object] = None, *, probe_interval: int = 8,
                 max_probe_interval: int = 128, probe_tokens: int = 2, margin: float = 1.0,
                 shadow_probes: bool = False):
        self.n_max = n_max
        self.costs = costs if costs is not None else CostModel()
        self.acceptance = AcceptanceModel(n_max)
        self.min_probe_interval = probe_interval
        self.max_probe_interval = max_probe_interval
        self.probe_interval = probe_interval
        self.probe_tokens = probe_tokens
        self._probe_len = probe_tokens
        self.margin = margin  # speculation must beat ordinary by this factor
        self._since_probe = 0
        self._probing = False
        self.shadow_probes = shadow_probes
        self._shadow = 0  # tokens of a shadow probe chosen for this step, until the loop takes it
        self._verify_next_probe = False
        self._steps = 0
        self.extend_every = 8
        self.stats: Optional[SpecStats] = None  # the current generation's stats, set by the engine

    # ---- the DraftController protocol ---------------------------------------------------------
    def choose(self, n_limit: int) -> int:
        n_limit = min(n_limit, self.n_max)
        k = self._explore(n_limit)
        if k is None:
            k = self.best_k(n_limit)
            self._probing = False
            self._steps += 1
            if 0 < k < n_limit and self._steps % self.extend_every == 0:
                k += 1  # now and then one slot deeper, so that slot's acceptance stays measured
            if k == 0:
                self._since_probe += 1
                if self._since_probe >= self.probe_interval:
                    self._since_probe = 0
                    if self.shadow_probes and not self._verify_next_probe:
                        self._shadow = min(self._probe_len, n_limit)
                    else:
                        self._probing = True
                        k = min(self._probe_len, n_limit)
        self._record_choice(k)
        return k

    def shadow_probe(self) -> int:
        """Tokens to draft without verifying them in the step just chosen (0: none); the loop
        reports the outcome with `observe_shadow`."""
        n, self._shadow = self._shadow, 0
        return n

    def observe(self, n_draft: int, n_accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        self.costs.observe(n_draft, draft_seconds, verify_seconds)
        if n_draft:
            self.acceptance.observe(n_draft, n_accepted)
        if self._probing:
            self._probing = False
            self._after_probe(n_draft, n_accepted)
        if self.stats is not None and (n_draft or self._steps % 32 == 0):
            self.stats.cost_curve = {str(k): v for k, v in self.costs.curve().items()}

    def observe_many(self, n_draft: int, accepted: Sequence[int], draft_seconds: float,
                     verify_seconds: float) -> None:
        """One step in which several sequences each verified `n_draft` drafts in one decode (the
        batched engine): the step's cost is learnt once, every sequence's acceptance, and a probe
        is judged by its best sequence."""
        self.costs.observe(n_draft, draft_seconds, verify_seconds)
        if n_draft:
            for n_accepted in accepted:
                self.acceptance.observe(n_draft, n_accepted)
        if self._probing:
            self._probing = False
            self._after_probe(n_draft, max(accepted, default=0))

    def observe_shadow(self, n_draft: int, n_accepted: int) -> None:
        """A shadow probe's outcome: of its n_draft tokens, the first n_accepted were what the
        target produced (acceptance only: nothing was verified, so there is no cost to learn)."""
        if n_draft:
            self.acceptance.observe(n_draft, n_accepted)
            self._after_probe(n_draft, n_accepted)

    def _after_probe(self, n_draft: int, n_accepted: int) -> None:
        self._verify_next_probe = bool(n_draft) and n_accepted == n_draft
        if self._verify_next_probe:
            # a fully accepted probe: probe again at once with a block twice as long, so the
            # acceptance of deeper slots gets measured and speculation can resume
            self._probe_len = min(self.n_max, 2 * n_draft)
            self._since_probe = self.probe_interval
        elif n_accepted and self.best_k(self.n_max) > 0:
            # the probe changed the decision: speculation pays again, stay attentive
            self.probe_interval = self.min_probe_interval
            self._probe_len = self.probe_tokens
        else:  # a probe that changed nothing makes the next one rarer
            self.probe_interval = min(self.max_probe_interval, 2 * self.probe_interval)
            self._probe_len = self.probe_tokens

    # ---- decisions -----------------------------------------------------------------------------
    def _explore(self, n_limit: int) -> Optional[int]:
        """Measure ordinary decoding and a short probe block before trusting the fit.

        Two points give the cost line; deeper blocks get measured when drafting pays (see
        `extend_every`).  Measuring the longest block up front would cost several single decodes
        on a CPU, on every engine, even when speculation never pays there.
        """
        if n_limit < self.n_max:  # a short tail at the end of a generation: use what is known
            return None
        for k in (0, max(1, min(self.probe_tokens, n_limit))):
            if not self.costs.known(k):
                return k
        return None

    def rate(self, k: int) -> float:
        """Expected tokens per second when drafting k."""
        tv, td = self.costs.verify_time(k), self.costs.draft_time(k)
        if tv is None or td is None:
            return 0.0
        return self.acceptance.expected_tokens(k) / (tv + td)

    def best_k(self, n_limit: int) -> int:
        """argmax over k of rate(k), in one pass (this runs every step, so it must stay cheap)."""
        best, best_rate = 0, self.rate(0) * self.margin
        costs, acc = self.costs, self.acceptance
        expected, run = 1.0, 1.0
        for k in range(1, n_limit + 1):
            run *= acc.p(k - 1)
            expected += run
            tv, td = costs.verify_time(k), costs.draft_time(k)
            if tv is None or td is None:
                continue
            r = expected / (tv + td)
            if r > best_rate:
                best, best_rate = k, r
        return best

    def _record_choice(self, k: int) -> None:
        s = self.stats
        if s is None:
            return
        s.chosen_draft_tokens[str(k)] = s.chosen_draft_tokens.get(str(k), 0) + 1
        if k == 0:
            s.ordinary_steps += 1


@dataclass
class ShadowProbe:
    """A probe drafted but not verified, scored against the tokens the loop goes on to commit.

    Under greedy decoding a verification would have accepted exactly the matching prefix (with
    sampling, the same in distribution), so the controller learns the acceptance without paying
    for a wide verification batch."""

    tokens: list[int]
    matched: int = 0
    done: bool = False

    def feed(self, committed: Sequence[int], controller: "AdaptiveController", stats: SpecStats) -> bool:
        """Score the next committed tokens; once decided, report it (True: the probe is over)."""
        for tok in committed:
            if tok != self.tokens[self.matched]:
                self.done = True
                break
            self.matched += 1
            if self.matched == len(self.tokens):
                self.done = True
                break
        if self.done:
            stats.shadow_accepted += self.matched
            controller.observe_shadow(len(self.tokens), self.matched)
        return self.done
