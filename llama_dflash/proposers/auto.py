"""`AutoProposer`: every step, the lookup's draft, a model's block (the target's MTP head, a
DFlash/DSpark draft) or no draft at all, whichever promises the most tokens per second by what
this engine measured.

The choice is the adaptive controller's (`adaptive.py`) with a second candidate: expected tokens
of a step over its expected cost.  What each option costs comes from measurements of this run:

* a step's verification (target decode of k+1 rows, sampling, feature injection) as a line in k,
  one curve for every option, since the target does not care who drafted; timed from the end of
  `propose` to the `accept` that follows it;
* each model's block, another line in k per model, measured on the steps it drafted;
* the lookup's own time, a running mean (microseconds).

What each option yields: for the lookup, the per-slot acceptance `SuffixLookup.predict` attaches
to its draft (from the match length and the acceptance seen so far at that length); for each
model, `AcceptanceModel`'s per-slot rates (measured on its own steps, decayed).  The
draft length is part of the choice: each option is scored at every k up to its limit.

Until the costs of no draft and of a short draft are known the first steps measure them.  While
a model is not chosen it is probed now and then (rarer after each probe that changed nothing),
so a draft that starts paying again is noticed.  A probe is a shadow: the model drafts its block
on a step that decodes ordinarily, nothing of it is verified, and the block is scored against
the tokens the target goes on to commit -- what a verification would have accepted under greedy
decoding.  It costs the draft block alone; a verified probe on this 2-core CPU cost two ordinary
steps, and five of them in a 128-token answer were 8% of its time.

The lookup's draft length starts short and grows only with drafts accepted whole (`lookup_cap`:
2, doubled after each fully accepted lookup draft up to its n_max, back to twice the accepted
run after a rejection).  Its per-slot confidence comes from match-length statistics pooled over
copy-heavy and chat text; on prose a restated phrase of the question matches 4-8 tokens, scores
0.8-0.9 per slot and fails at once.  Seen on SmolLM2 with 4 prose prompts x 128 tokens: 5-6
lookup drafts of 16 tokens per answer, 1-6 tokens accepted in all, each a 17-row verification
(about 4 ordinary decodes on this CPU).  Capped, a wrong guess costs a 3-row verification, and a
right one reaches 16 tokens within three steps.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence, Union

import numpy as np

from ..adaptive import AcceptanceModel, CostModel
from ..stats import SpecStats
from .base import Proposer
from .chain import SpeculatorCounts
from .lookup import LookupDraft, SuffixLookup

__all__ = ["AutoProposer"]

NONE, LOOKUP, MODEL, PROBE = "none", "lookup", "model", "probe"


class _Arm:
    """One model `auto` can draft with, and what this run measured of it."""

    def __init__(self, name: str, proposer: Proposer, probe_interval: int):
        self.name = name
        self.proposer = proposer
        self.costs = CostModel()  # its block, by k
        self.acceptance = AcceptanceModel(proposer.n_max)
        self.probe_interval = probe_interval
        self.since = 0  # steps since it last drafted or was probed

    @property
    def n_max(self) -> int:
        return self.proposer.n_max


ModelsArg = Union[None, Proposer, Sequence[tuple[str, Proposer]]]


class AutoProposer:
    """The `auto` speculative type: lookup, one of the models or nothing, chosen per step.

    `models` (the target's MTP head, a DFlash/DSpark draft: `(name, Proposer)` pairs, or a single
    `Proposer` named `model_name`) are borrowed: their owner closes them.  `counts` has one
    `SpeculatorCounts` per member ("lookup" and each model's name); steps that chose no draft
    are in `none_steps`."""

    def __init__(self, lookup: SuffixLookup, models: ModelsArg = None, *,
                 model_name: str = "draft-dflash", margin: float = 1.0, probe_interval: int = 8,
                 max_probe_interval: int = 128, probe_tokens: int = 2):
        if models is None:
            pairs: list[tuple[str, Proposer]] = []
        elif isinstance(models, (list, tuple)):
            pairs = list(models)
        else:
            pairs = [(model_name, models)]  # type: ignore[list-item]
        self.lookup = lookup
        self.margin = margin  # a draft must beat no draft by this factor
        self.verify_costs = CostModel()  # step cost after the draft, by k
        self.arms = [_Arm(name, proposer, probe_interval) for name, proposer in pairs]
        self.lookup_seconds = 0.0  # running mean of one lookup
        self.min_probe_interval = probe_interval
        self.max_probe_interval = max_probe_interval
        self.probe_tokens = probe_tokens
        self.lookup_cap = probe_tokens  # the longest lookup draft for now (see the module docstring)
        self._pending: Optional[tuple[str, Optional[_Arm], int, float]] = None  # (choice, arm, k, end of propose)
        self._shadow: Optional[tuple[_Arm, list[int], int]] = None  # (arm, block, index of its id_last in history)
        self._probe_next: Optional[_Arm] = None
        self.stats: Optional[SpecStats] = None
        self.reset_counts()

    # ---- the Proposer interface ----------------------------------------------------------------
    @property
    def model(self) -> Optional[Proposer]:
        """The first model (compatibility: the only one before MTP heads joined)."""
        return self.arms[0].proposer if self.arms else None

    @property
    def n_max(self) -> int:
        return max([self.lookup.n_max] + [a.n_max for a in self.arms])

    @property
    def needs_features(self) -> bool:
        return bool(self.arms)

    @property
    def names(self) -> tuple[str, ...]:
        return (LOOKUP,) + tuple(a.name for a in self.arms)

    @property
    def label(self) -> str:
        """What the statistics call it: "auto", with its models' types."""
        return ",".join(("auto",) + tuple(a.name for a in self.arms))

    def begin(self, prompt: Sequence[int]) -> None:
        self._pending = None
        self._shadow = None
        self.reset_counts()
        self.lookup.begin(prompt)
        for a in self.arms:
            a.proposer.begin(prompt)

    def inject(self, features: np.ndarray, pos0: int) -> None:
        for a in self.arms:
            a.proposer.inject(features, pos0)

    def propose(self, id_last: int, n_past: int, n: int, *, shadow: bool = False,
                history: Sequence[int] = ()) -> list[int]:
        if shadow:  # (the loop probes only through a controller; auto has none)
            return []
        if self._shadow is not None:
            self._score_shadow(history, id_last)
        t0 = time.perf_counter()
        pred = self.lookup.predict(history, id_last)
        t1 = time.perf_counter()
        self.lookup_seconds += 0.1 * ((t1 - t0) - self.lookup_seconds)
        lk = self.counts[LOOKUP]
        lk.draft_calls += 1
        lk.draft_seconds += t1 - t0
        if self.stats is not None:
            self.stats.draft_seconds += t1 - t0
        choice, arm, k = self._choose(pred, n)
        tokens: list[int] = []
        if choice == PROBE:
            assert arm is not None
            self._shadow_probe(arm, id_last, n_past, history)
            choice, arm = NONE, None
        if choice == LOOKUP:
            tokens = self.lookup.take(pred, k)
            self._record_draft(lk, tokens, t1 - t0)
        elif choice == MODEL:
            assert arm is not None
            mc = self.counts[arm.name]
            mc.draft_calls += 1
            t2 = time.perf_counter()
            tokens = [int(t) for t in arm.proposer.propose(id_last, n_past, k, history=history)]
            seconds = time.perf_counter() - t2
            mc.draft_seconds += seconds
            arm.costs.observe(len(tokens), seconds, 0.0)
            if tokens:
                mc.drafts += 1
                mc.drafted += len(tokens)
        if not tokens:
            choice, arm = NONE, None
            self.none_steps += 1
        self._pending = (choice, arm, len(tokens), time.perf_counter())
        return tokens

    def accept(self, n_accepted: int) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        choice, arm, k, t_end = pending
        self.verify_costs.observe(k, 0.0, time.perf_counter() - t_end)
        self.lookup.accept(n_accepted, choice != LOOKUP)
        if choice == LOOKUP:
            self.counts[LOOKUP].record_accept(n_accepted)
            if k and n_accepted >= k:
                self.lookup_cap = min(self.lookup.n_max, 2 * max(k, self.lookup_cap))
            elif k:
                self.lookup_cap = max(self.probe_tokens, 2 * n_accepted)
        elif choice == MODEL:
            assert arm is not None
            arm.proposer.accept(n_accepted)
            arm.acceptance.observe(k, n_accepted)
            self.counts[arm.name].record_accept(n_accepted)

    def rollback(self, n_past: int) -> None:
        for a in self.arms:
            a.proposer.rollback(n_past)

    def clear(self) -> None:
        for a in self.arms:
            a.proposer.clear()

    def pos_max(self) -> int:
        return self.arms[0].proposer.pos_max() if self.arms else -1  # type: ignore[attr-defined]

    def knows(self, pos: int) -> bool:
        return all(getattr(a.proposer, "knows", lambda p: True)(pos) for a in self.arms)

    def close(self) -> None:
        """Owns no handle: the models' owner closes them."""

    # ---- counts ----------------------------------------------------------------------------------
    def reset_counts(self) -> None:
        self.counts = {name: SpeculatorCounts(name) for name in self.names}
        self.none_steps = 0

    def report(self, stats: SpecStats) -> None:
        """Per-member raw counts of the generation since `begin` into `stats.speculators`."""
        stats.speculators = {name: c.raw() for name, c in self.counts.items()}
        stats.speculators["none"] = {"drafts": self.none_steps}

    def _record_draft(self, counts: SpeculatorCounts, tokens: list[int], seconds: float) -> None:
        if not tokens:
            return
        counts.drafts += 1
        counts.drafted += len(tokens)
        if self.stats is not None:
            self.stats.draft_steps += 1
            self.stats.drafted += len(tokens)

    # ---- shadow probes of a model -----------------------------------------------------------------
    def _shadow_probe(self, arm: _Arm, id_last: int, n_past: int, history: Sequence[int]) -> None:
        """Draft the model's block without verifying it; `_score_shadow` grades it later."""
        mc = self.counts[arm.name]
        mc.draft_calls += 1
        t0 = time.perf_counter()
        block = [int(t) for t in arm.proposer.propose(id_last, n_past, arm.n_max, shadow=True, history=history)]
        seconds = time.perf_counter() - t0
        mc.draft_seconds += seconds
        if self.stats is not None:
            self.stats.shadow_probes += 1
        if block:
            arm.costs.observe(len(block), seconds, 0.0)
            self._shadow = (arm, block, len(history))
        else:
            self._after_probe(arm, 0)

    def _score_shadow(self, history: Sequence[int], id_last: int) -> None:
        """Compare the shadow block with what was committed after its id_last (greedy: exactly
        what a verification would have accepted); report it once it is decided."""
        assert self._shadow is not None
        arm, block, at = self._shadow
        committed = list(history[at + 1:]) + [id_last]
        matched = 0
        for tok, want in zip(committed, block):
            if tok != want:
                break
            matched += 1
        else:
            if matched < len(block) and len(committed) < len(block):
                return  # all it could be compared with agreed: wait for more tokens
        self._shadow = None
        arm.acceptance.observe(len(block), matched)
        if self.stats is not None:
            self.stats.shadow_accepted += matched
        self._after_probe(arm, matched)

    def _after_probe(self, arm: _Arm, matched: int) -> None:
        """A probe that would change the decision keeps probing often; one that changed nothing
        makes the next one rarer."""
        if matched and self._model_rate(arm, arm.n_max)[1] > self._none_rate() * self.margin:
            arm.probe_interval = self.min_probe_interval
        else:
            arm.probe_interval = min(self.max_probe_interval, 2 * arm.probe_interval)

    # ---- the decision ----------------------------------------------------------------------------
    def _none_rate(self) -> float:
        tv = self.verify_costs.verify_time(0)
        return 1.0 / tv if tv else 0.0

    def _lookup_rate(self, pred: LookupDraft, n: int) -> tuple[int, float]:
        """(k, expected tokens per second) of the lookup's best length."""
        best_k, best = 0, 0.0
        expected, run = 1.0, 1.0
        for k, p in enumerate(pred.p_accept[:n], start=1):
            run *= p
            expected += run
            tv = self.verify_costs.verify_time(k)
            if tv is None:
                continue
            r = expected / (tv + self.lookup_seconds)
            if r > best:
                best_k, best = k, r
        return best_k, best

    def _model_rate(self, arm: _Arm, n: int) -> tuple[int, float]:
        """(k, expected tokens per second) of a model's best block length."""
        best_k, best = 0, 0.0
        expected, run = 1.0, 1.0
        for k in range(1, min(n, arm.n_max) + 1):
            run *= arm.acceptance.p(k - 1)
            expected += run
            tv, td = self.verify_costs.verify_time(k), arm.costs.draft_time(k)
            if tv is None or td is None:
                continue
            r = expected / (tv + td + self.lookup_seconds)
            if r > best:
                best_k, best = k, r
        return best_k, best

    def _choose(self, pred: LookupDraft, n: int) -> tuple[str, Optional[_Arm], int]:
        if n <= 0:
            return NONE, None, 0
        # measure first: no draft, then one short draft (the lookup's if it has one)
        if not self.verify_costs.known(0):
            return NONE, None, 0
        short = min(self.probe_tokens, n)
        if not any(self.verify_costs.known(k) for k in range(1, n + 1)):
            if pred.tokens:
                return LOOKUP, None, min(short, len(pred.tokens))
            if self.arms:
                return MODEL, self.arms[0], short
            return NONE, None, 0
        for arm in self.arms:  # each model's block cost and first acceptance, from a shadow
            if not arm.costs.curve():
                return (PROBE, arm, 0) if self._shadow is None else (NONE, None, 0)
        options: list[tuple[float, str, Optional[_Arm], int]] = [(self._none_rate() * self.margin, NONE, None, 0)]
        if pred.tokens:
            k, r = self._lookup_rate(pred, min(n, len(pred.tokens), self.lookup_cap))
            if k:
                options.append((r, LOOKUP, None, k))
        for arm in self.arms:
            k, r = self._model_rate(arm, n)
            if k:
                options.append((r, MODEL, arm, k))
        rate, choice, chosen, k = max(options, key=lambda o: o[0])
        probe: Optional[_Arm] = None
        for arm in self.arms:
            if arm is chosen:
                arm.since = 0
                continue
            arm.since += 1
            if probe is None and choice == NONE and arm.since >= arm.probe_interval and self._shadow is None:
                probe = arm
        if probe is not None:
            probe.since = 0
            return PROBE, probe, 0
        return choice, chosen, k
