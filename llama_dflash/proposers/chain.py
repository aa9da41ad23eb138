"""`ChainProposer`: several drafters behind one `Proposer`, with llama.cpp's chain semantics.

llama.cpp's `--spec-type a,b,...` (common/speculative.cpp) asks its speculators in a fixed priority
(n-gram types first, the draft model last); the first non-empty draft wins the step and is cut to
the step's budget; after verification the winner hears `accept(n, is_other=False)` and every other
speculator `accept(n, is_other=True)`.  The winner is remembered until another one drafts (a step
where nobody drafts reports to the previous winner, as there).  A draft model in the chain keeps its
features current on every step, whoever drafted: the loop injects every verified row into it.
Several models can join (the target's MTP head before a draft model, as llama.cpp orders them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np

from ..stats import SpecStats
from .base import Proposer, TokenDrafter

__all__ = ["ChainProposer", "SpeculatorCounts", "ModelMember"]


@dataclass
class SpeculatorCounts:
    """What one speculator of a chain did (llama.cpp's per-implementation statistics)."""

    name: str
    draft_calls: int = 0  # times it was asked for a draft
    drafts: int = 0  # times its draft won the step
    drafted: int = 0  # tokens of those drafts (after the budget cut)
    accepted_drafts: int = 0  # steps where at least one of its tokens was accepted
    accepted: int = 0  # its tokens accepted
    accepted_per_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0

    def record_accept(self, n_accepted: int) -> None:
        if n_accepted > 0:
            self.accepted_drafts += 1
            self.accepted += n_accepted
            grow = n_accepted - len(self.accepted_per_position)
            if grow > 0:
                self.accepted_per_position.extend([0] * grow)
            for i in range(n_accepted):
                self.accepted_per_position[i] += 1

    @property
    def tokens_per_step(self) -> float:
        """tau over the steps this speculator drafted: its accepted tokens plus the target's own."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    def raw(self) -> dict:
        """The counters alone (no name, no derived rates): what `SpecStats.merge` can add up."""
        return {"draft_calls": self.draft_calls, "drafts": self.drafts, "drafted": self.drafted,
                "accepted_drafts": self.accepted_drafts, "accepted": self.accepted,
                "accepted_per_position": list(self.accepted_per_position), "draft_seconds": self.draft_seconds}

    def to_dict(self) -> dict:
        return {
            "name": self.name, "draft_calls": self.draft_calls, "drafts": self.drafts, "drafted": self.drafted,
            "accepted_drafts": self.accepted_drafts, "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "tokens_per_step": self.tokens_per_step,
            "acceptance_per_position": [a / self.drafts for a in self.accepted_per_position] if self.drafts else [],
            "draft_seconds": self.draft_seconds,
        }

    def merge(self, other: "SpeculatorCounts") -> None:
        for name in ("draft_calls", "drafts", "drafted", "accepted_drafts", "accepted", "draft_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        grow = len(other.accepted_per_position) - len(self.accepted_per_position)
        if grow > 0:
            self.accepted_per_position.extend([0] * grow)
        for i, v in enumerate(other.accepted_per_position):
            self.accepted_per_position[i] += v


class ModelMember:
    """A draft model (`Proposer`) seen as a chain member: it drafts from its own cache."""

    def __init__(self, proposer: Proposer, name: str):
        self.proposer = proposer
        self.name = name

    @property
    def n_max(self) -> int:
        return self.proposer.n_max

    def begin(self, prompt: Sequence[int]) -> None:
        self.proposer.begin(prompt)

    def propose(self, id_last: int, n_past: int, n: int, history: Sequence[int]) -> list[int]:
        n = min(n, self.proposer.n_max)
        return self.proposer.propose(id_last, n_past, n, history=history) if n > 0 else []

    def accept(self, n_accepted: int, is_other: bool) -> None:
        self.proposer.accept(n_accepted)


Member = Union[TokenDrafter, ModelMember]


class ChainProposer:
    """Token drafters in priority order, then (optionally) the draft model, as one `Proposer`.

    `counts` holds each member's `SpeculatorCounts`, by name, for the generations since the last
    `reset_counts`."""

    def __init__(self, drafters: Sequence[TokenDrafter],
                 model: Union[None, ModelMember, Sequence[ModelMember]] = None):
        models = [] if model is None else [model] if isinstance(model, ModelMember) else list(model)
        members: list[Member] = list(drafters) + models
        if not members:
            raise ValueError("a chain needs at least one drafter")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"a chain cannot hold the same speculator twice: {', '.join(names)}")
        self.members: tuple[Member, ...] = tuple(members)
        self.drafters: tuple[TokenDrafter, ...] = tuple(drafters)
        # the models (the target's MTP head, a draft model), in priority order after the drafters
        self.models: tuple[ModelMember, ...] = tuple(models)
        self.model: Optional[ModelMember] = self.models[0] if self.models else None
        self._last: Optional[Member] = None  # the latest winner (llama.cpp's impl_last)
        self._won = False  # whether it won the current step
        # where token drafters' tokens and time are counted (the draft model counts its own)
        self.stats: Optional[SpecStats] = None
        self.reset_counts()

    @property
    def n_max(self) -> int:
        """The longest draft any member can return (llama.cpp's `common_speculative_n_max`)."""
        return max(m.n_max for m in self.members)

    @property
    def needs_features(self) -> bool:
        return bool(self.models)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    @property
    def label(self) -> str:
        """What the statistics call this chain: llama.cpp's --spec-type list."""
        return ",".join(self.names)

    def begin(self, prompt: Sequence[int]) -> None:
        """A new generation: llama.cpp's begin for every member; the counts start from zero."""
        self._last = None
        self._won = False
        self.reset_counts()
        for m in self.members:
            m.begin(prompt)

    def inject(self, features: np.ndarray, pos0: int) -> None:
        for m in self.models:
            m.proposer.inject(features, pos0)

    def propose(self, id_last: int, n_past: int, n: int, *, shadow: bool = False,
                history: Sequence[int] = ()) -> list[int]:
        """The first member's non-empty draft, cut to n tokens.  A shadow probe (adaptive idle
        probing) asks only the draft model, which is what the probe measures."""
        if shadow:
            if self.model is None:
                return []
            return self.model.proposer.propose(id_last, n_past, n, shadow=True, history=history)
        self._won = False
        for m in self.members:
            counts = self.counts[m.name]
            counts.draft_calls += 1
            t0 = time.perf_counter()
            is_model = isinstance(m, ModelMember)
            if is_model:
                draft = m.propose(id_last, n_past, n, history)
            else:
                draft = m.draft(history, id_last)
            seconds = time.perf_counter() - t0
            counts.draft_seconds += seconds
            stats = self.stats
            if stats is not None and not is_model:
                stats.draft_seconds += seconds
            if draft:
                draft = [int(t) for t in draft[:n]] if n > 0 else [int(t) for t in draft]
                counts.drafts += 1
                counts.drafted += len(draft)
                if stats is not None and not is_model:
                    stats.draft_steps += 1
                    stats.drafted += len(draft)
                self._last = m
                self._won = True
                return draft
        return []

    def accept(self, n_accepted: int) -> None:
        last = self._last
        if last is None:
            return
        if self._won:
            self.counts[last.name].record_accept(n_accepted)
        last.accept(n_accepted, False)
        for m in self.members:
            if m is not last:
                m.accept(n_accepted, True)

    def rollback(self, n_past: int) -> None:
        for m in self.models:
            m.proposer.rollback(n_past)

    def clear(self) -> None:
        for m in self.models:
            m.proposer.clear()

    def pos_max(self) -> int:
        return self.model.proposer.pos_max() if self.model is not None else -1

    def knows(self, pos: int) -> bool:
        return all(getattr(m.proposer, "knows", lambda p: True)(pos) for m in self.models)

    def close(self) -> None:
        """The chain owns no handle: the models' owner closes them."""

    def counts_dict(self) -> dict[str, dict]:
        """Each member's counts with derived rates, by name."""
        return {name: c.to_dict() for name, c in self.counts.items()}

    def report(self, stats: SpecStats) -> None:
        """Put the raw counts of the generation since `begin` into `stats.speculators`."""
        stats.speculators = {name: c.raw() for name, c in self.counts.items()}

    def reset_counts(self) -> None:
        self.counts = {m.name: SpeculatorCounts(m.name) for m in self.members}
