"""ChainProposer: llama.cpp's chain rules, checked with drafters that record what they hear."""

from __future__ import annotations

import pytest

from llama_dflash.proposers.chain import ChainProposer, ModelMember
from llama_dflash.stats import SpecStats


class Fixed:
    """A token drafter that returns the next scripted draft and records every call."""

    def __init__(self, name: str, drafts: list[list[int]], n_max: int = 8):
        self.name, self.n_max = name, n_max
        self.drafts = list(drafts)
        self.calls: list[tuple] = []

    def begin(self, prompt):
        self.calls.append(("begin", list(prompt)))

    def draft(self, history, id_last):
        self.calls.append(("draft", len(history), id_last))
        return self.drafts.pop(0) if self.drafts else []

    def accept(self, n_accepted, is_other):
        self.calls.append(("accept", n_accepted, is_other))


class FakeModel:
    """A draft model: records proposals, rollbacks and injections."""

    def __init__(self, n_max: int = 4):
        self.n_max = n_max
        self.log: list[tuple] = []

    def begin(self, prompt):
        self.log.append(("begin",))

    def inject(self, features, pos0):
        self.log.append(("inject", pos0))

    def propose(self, id_last, n_past, n, *, shadow=False, history=()):
        self.log.append(("propose", n, shadow))
        return [100 + i for i in range(n)]

    def accept(self, n_accepted):
        self.log.append(("accept", n_accepted))

    def rollback(self, n_past):
        self.log.append(("rollback", n_past))

    def clear(self):
        self.log.append(("clear",))

    def close(self):
        self.log.append(("close",))


def _accepts(drafter):
    return [c[1:] for c in drafter.calls if c[0] == "accept"]


def test_first_non_empty_draft_wins_and_everyone_hears_the_acceptance():
    a = Fixed("ngram-simple", [[], [1, 2, 3]])
    b = Fixed("ngram-map-k", [[7, 8], [9]])
    chain = ChainProposer([a, b])
    chain.begin([5, 6])
    assert chain.propose(0, 2, 8, history=[5, 6]) == [7, 8]  # a had nothing: b's draft
    chain.accept(1)
    assert chain.propose(0, 4, 8, history=[5, 6, 0, 7]) == [1, 2, 3]  # a first now; b never asked
    chain.accept(3)
    assert [c for c in b.calls if c[0] == "draft"] == [("draft", 2, 0)]
    assert _accepts(a) == [(1, True), (3, False)]
    assert _accepts(b) == [(1, False), (3, True)]
    counts = chain.counts
    assert (counts["ngram-map-k"].drafts, counts["ngram-map-k"].drafted, counts["ngram-map-k"].accepted) == (1, 2, 1)
    assert (counts["ngram-simple"].draft_calls, counts["ngram-simple"].drafts,
            counts["ngram-simple"].accepted, counts["ngram-simple"].accepted_per_position) == (2, 1, 3, [1, 1, 1])


def test_a_step_without_draft_reports_to_the_last_winner_but_counts_nothing():
    a = Fixed("ngram-simple", [[4, 4], [], []])
    chain = ChainProposer([a])
    chain.begin([])
    chain.propose(0, 0, 8, history=[])
    chain.accept(2)
    assert chain.propose(0, 3, 8, history=[1, 2, 3]) == []
    chain.accept(0)  # llama.cpp: impl_last is still the previous winner
    assert _accepts(a) == [(2, False), (0, False)]
    assert chain.counts["ngram-simple"].drafts == 1
    assert chain.counts["ngram-simple"].accepted == 2


def test_nobody_drafted_yet_means_nobody_is_told():
    a = Fixed("ngram-simple", [])
    chain = ChainProposer([a])
    chain.begin([])
    assert chain.propose(0, 0, 8, history=[]) == []
    chain.accept(0)
    assert _accepts(a) == []


def test_the_draft_is_cut_to_the_budget():
    chain = ChainProposer([Fixed("ngram-simple", [[1, 2, 3, 4, 5]])])
    chain.begin([])
    assert chain.propose(0, 0, 2, history=[]) == [1, 2]
    assert chain.counts["ngram-simple"].drafted == 2


def test_the_model_drafts_last_within_its_own_length_and_keeps_its_features():
    model = FakeModel(n_max=3)
    chain = ChainProposer([Fixed("ngram-map-k", [[1, 2, 3, 4, 5, 6], []])], ModelMember(model, "draft-dflash"))
    assert chain.needs_features and chain.n_max == 8
    chain.begin([])
    assert chain.propose(0, 0, 8, history=[]) == [1, 2, 3, 4, 5, 6]  # the n-gram draft is not cut to 3
    chain.inject(None, 0)
    assert chain.propose(0, 7, 8, history=list(range(7))) == [100, 101, 102]
    chain.accept(2)
    chain.rollback(9)
    assert ("inject", 0) in model.log and ("propose", 3, False) in model.log
    assert ("accept", 2) in model.log and ("rollback", 9) in model.log
    # a shadow probe measures the model, never the n-gram drafters
    assert chain.propose(0, 9, 2, shadow=True, history=list(range(9))) == [100, 101]


def test_token_only_chain_needs_no_features_and_shadow_probes_return_nothing():
    chain = ChainProposer([Fixed("ngram-simple", [[1]])])
    assert not chain.needs_features
    assert chain.propose(0, 0, 4, shadow=True, history=[]) == []


def test_stats_count_token_drafts_and_report_raw_counts():
    stats = SpecStats()
    chain = ChainProposer([Fixed("ngram-simple", [[1, 2], [3]])])
    chain.stats = stats
    chain.begin([])
    chain.propose(0, 0, 8, history=[])
    chain.accept(1)
    chain.propose(0, 2, 8, history=[0, 1])
    chain.accept(0)
    assert (stats.drafted, stats.draft_steps) == (3, 2)
    chain.report(stats)
    raw = stats.speculators["ngram-simple"]
    assert (raw["drafts"], raw["drafted"], raw["accepted"], raw["accepted_per_position"]) == (2, 3, 1, [1])
    chain.begin([])  # a new generation starts from zero
    assert chain.counts["ngram-simple"].drafts == 0


def test_a_chain_needs_distinct_members():
    with pytest.raises(ValueError, match="at least one"):
        ChainProposer([])
    with pytest.raises(ValueError, match="twice"):
        ChainProposer([Fixed("ngram-simple", []), Fixed("ngram-simple", [])])
