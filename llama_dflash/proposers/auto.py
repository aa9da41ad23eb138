"""`AutoProposer`: every step, the lookup's draft, the draft model's block or no draft at all,
whichever promises the most tokens per second by what this engine measured.

The choice is the adaptive controller's (`adaptive.py`) with a second candidate: expected tokens
of a step over its expected cost.  What each option costs comes from measurements of this run:

* a step's verification (target decode of k+1 rows, sampling, feature injection) as a line in k,
  one curve for every option, since the target does not care who drafted; timed from the end of
  `propose` to the `accept` that follows it;
* the draft model's block, another line in k, measured on the steps it drafted;
* the lookup's own time, a running mean (microseconds).

What each option yields: for the lookup, the per-slot acceptance `SuffixLookup.predict` attaches
to its draft (from the match length and the acceptance seen so far at that length); for the
draft model, `AcceptanceModel`'s per-slot rates (measured on its own steps, decayed).  The
draft length is part of the choice: each option is scored at every k up to its limit.

Until the costs of no draft and of a short draft are known the first steps measure them.  While
the model is not chosen it is probed now and then (rarer after each probe that changed nothing),
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
from typing import Optional, Sequence

import numpy as np

from ..adaptive import AcceptanceModel, CostModel
from ..stats import SpecStats
from .base import Proposer
from .chain import SpeculatorCounts
from .lookup import LookupDraft, SuffixLookup

__all__ = ["AutoProposer"]

NONE, LOOKUP, MODEL, PROBE = "none", "lookup", "model", "probe"


class AutoProposer:
    """The `auto` speculative type: lookup, draft model or nothing, chosen per step.

    `model` (a DFlash/DSpark `Proposer`, or None) is borrowed: its owner closes it.  `counts`
    has one `SpeculatorCounts` per member ("lookup" and the model's `model_name`); steps that
    chose no draft are in `none_steps`."""

    def __init__(self, lookup: SuffixLookup, model: Optional[Proposer] = None, *,
                 model_name: str = "draft-dflash", margin: float = 1.0, probe_interval: int = 8,
                 max_probe_interval: int = 128, probe_tokens: int = 2):
        self.lookup = lookup
        self.model = model
        self.model_name = model_name
        self.margin = margin  # a draft must beat no draft by this factor
        self.verify_costs = CostModel()  # step cost after the draft, by k
        self.model_costs = CostModel()  # the model's block, by k
        self.model_acceptance = AcceptanceModel(model.n_max) if model is not None else None
        self.lookup_seconds = 0.0  # running mean of one lookup
        self.min_probe_interval = probe_interval
        self.max_probe_interval = max_probe_interval
        self.probe_interval = probe_interval
        self.probe_tokens = probe_tokens
        self.lookup_cap = probe_tokens  # the longest lookup draft for now (see the module docstring)
        self._since_model = 0
        self._pending: Optional[tuple[str, int, float]] = None  # (choice, k, end of propose)
        self._shadow: Optional[tuple[list[int], int]] = None  # (block, index of its id_last in history)
        self.stats: Optional[SpecStats] = None
        self.reset_counts()

    # ---- the Proposer interface ----------------------------------------------------------------
    @property
    def n_max(self) -> int:
        return max(self.lookup.n_max, self.model.n_max if self.model is not None else 0)

    @property
    def needs_features(self) -> bool:
        return self.model is not None

    @property
    def names(self) -> tuple[str, ...]:
        return (LOOKUP,) + ((self.model_name,) if self.model is not None else ())

    @property
    def label(self) -> str:
        """What the statistics call it: "auto", with the draft model's type when it has one."""
        return "auto" + ("," + self.model_name if self.model is not None else "")

    def begin(self, prompt: Sequence[int]) -> None:
        self._pending = None
        self._shadow = None
        self.reset_counts()
        self.lookup.begin(prompt)
        if self.model is not None:
            self.model.begin(prompt)

    def inject(self, features: np.ndarray, pos0: int) -> None:
        if self.model is not None:
            self.model.inject(features, pos0)

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
        choice, k = self._choose(pred, n)
        tokens: list[int] = []
        if choice == PROBE:
            self._shadow_probe(id_last, n_past, history)
            choice = NONE
        if choice == LOOKUP:
            tokens = self.lookup.take(pred, k)
            self._record_draft(lk, tokens, t1 - t0)
        elif choice == MODEL:
            assert self.model is not None
            mc = self.counts[self.model_name]
            mc.draft_calls += 1
            t2 = time.perf_counter()
            tokens = [int(t) for t in self.model.propose(id_last, n_past, k, history=history)]
            seconds = time.perf_counter() - t2
            mc.draft_seconds += seconds
            self.model_costs.observe(len(tokens), seconds, 0.0)
            if tokens:
                mc.drafts += 1
                mc.drafted += len(tokens)
        if not tokens:
            choice = NONE
            self.none_steps += 1
        self._pending = (choice, len(tokens), time.perf_counter())
        return tokens

    def accept(self, n_accepted: int) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        choice, k, t_end = pending
        self.verify_costs.observe(k, 0.0, time.perf_counter() - t_end)
        self.lookup.accept(n_accepted, choice != LOOKUP)
        if choice == LOOKUP:
            self.counts[LOOKUP].record_accept(n_accepted)
            if k and n_accepted >= k:
                self.lookup_cap = min(self.lookup.n_max, 2 * max(k, self.lookup_cap))
            elif k:
                self.lookup_cap = max(self.probe_tokens, 2 * n_accepted)
        elif choice == MODEL:
            assert self.model is not None and self.model_acceptance is not None
            self.model.accept(n_accepted)
            self.model_acceptance.observe(k, n_accepted)
            self.counts[self.model_name].record_accept(n_accepted)

    def rollback(self, n_past: int) -> None:
        if self.model is not None:
            self.model.rollback(n_past)

    def clear(self) -> None:
        if self.model is not None:
            self.model.clear()

    def pos_max(self) -> int:
        return self.model.pos_max() if self.model is not None else -1  # type: ignore[attr-defined]

    def close(self) -> None:
        """Owns no handle: the draft model's owner closes it."""

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

    # ---- shadow probes of the model ---------------------------------------------------------------
    def _shadow_probe(self, id_last: int, n_past: int, history: Sequence[int]) -> None:
        """Draft the model's block without verifying it; `_score_shadow` grades it later."""
        assert self.model is not None
        mc = self.counts[self.model_name]
        mc.draft_calls += 1
        t0 = time.perf_counter()
        block = [int(t) for t in self.model.propose(id_last, n_past, self.model.n_max, shadow=True,
                                                    history=history)]
        seconds = time.perf_counter() - t0
        mc.draft_seconds += seconds
        if self.stats is not None:
            self.stats.shadow_probes += 1
        if block:
            self.model_costs.observe(len(block), seconds, 0.0)
            self._shadow = (block, len(history))
        else:
            self._after_probe(0)

    def _score_shadow(self, history: Sequence[int], id_last: int) -> None:
        """Compare the shadow block with what was committed after its id_last (greedy: exactly
        what a verification would have accepted); report it once it is decided."""
        assert self._shadow is not None and self.model_acceptance is not None
        block, at = self._shadow
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
        self.model_acceptance.observe(len(block), matched)
        if self.stats is not None:
            self.stats.shadow_accepted += matched
        self._after_probe(matched)

    def _after_probe(self, matched: int) -> None:
        """A probe that would change the decision keeps probing often; one that changed nothing
        makes the next one rarer."""
        assert self.model is not None
        if matched and self._model_rate(self.model.n_max)[1] > self._none_rate() * self.margin:
            self.probe_interval = self.min_probe_interval
        else:
            self.probe_interval = min(self.max_probe_interval, 2 * self.probe_interval)

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

    def _model_rate(self, n: int) -> tuple[int, float]:
        """(k, expected tokens per second) of the model's best block length."""
        if self.model is None or self.model_acceptance is None:
            return 0, 0.0
        best_k, best = 0, 0.0
        expected, run = 1.0, 1.0
        for k in range(1, min(n, self.model.n_max) + 1):
            run *= self.model_acceptance.p(k - 1)
            expected += run
            tv, td = self.verify_costs.verify_time(k), self.model_costs.draft_time(k)
            if tv is None or td is None:
                continue
            r = expected / (tv + td + self.lookup_seconds)
            if r > best:
                best_k, best = k, r
        return best_k, best

    def _choose(self, pred: LookupDraft, n: int) -> tuple[str, int]:
        if n <= 0:
            return NONE, 0
        # measure first: no draft, then one short draft (the lookup's if it has one)
        if not self.verify_costs.known(0):
            return NONE, 0
        short = min(self.probe_tokens, n)
        if not any(self.verify_costs.known(k) for k in range(1, n + 1)):
            if pred.tokens:
                return LOOKUP, min(short, len(pred.tokens))
            if self.model is not None:
                return MODEL, short
            return NONE, 0
        if self.model is not None and not self.model_costs.curve():
            return PROBE, 0  # the model's block cost and first acceptance, from a shadow
        options = [(self._none_rate() * self.margin, NONE, 0)]
        if pred.tokens:
            k, r = self._lookup_rate(pred, min(n, len(pred.tokens), self.lookup_cap))
            if k:
                options.append((r, LOOKUP, k))
        if self.model is not None:
            k, r = self._model_rate(n)
            if k:
                options.append((r, MODEL, k))
        rate, choice, k = max(options, key=lambda o: o[0])
        if choice == MODEL or self.model is None:
            self._since_model = 0
        else:
            self._since_model += 1
            if choice == NONE and self._since_model >= self.probe_interval and self._shadow is None:
                self._since_model = 0
                return PROBE, 0
        return choice, k
