"""`AutoProposer`'s lookup length (issue 29, prose): a lookup draft starts short and grows only with
drafts the target accepted whole, so a confident-looking match that fails costs a short verify."""

from __future__ import annotations

from llama_dflash.proposers.auto import AutoProposer
from llama_dflash.proposers.factory import build_auto_lookup

TEXT = list(range(10, 60))  # 50 distinct tokens: the history repeats them, so the lookup matches long


def _auto_with_costs() -> AutoProposer:
    auto = AutoProposer(build_auto_lookup(), None)
    for k in range(0, 17):  # verification costs that make long drafts pay when they are right
        auto.verify_costs.observe(k, 0.0, 1.0 + 0.05 * k)
    return auto


def _step(auto: AutoProposer, history: list[int]) -> list[int]:
    return auto.propose(history[-1], len(history) - 1, 16, history=history[:-1])


def test_lookup_drafts_grow_with_whole_acceptance_and_shrink_after_a_rejection():
    auto = _auto_with_costs()
    auto.begin(TEXT)
    history = TEXT + TEXT[:6]  # the second copy's continuation is predictable
    lengths = []
    for _ in range(4):
        draft = _step(auto, history)
        lengths.append(len(draft))
        assert draft == [TEXT[(len(history) + i) % 50] for i in range(len(draft))]  # the copy's continuation
        auto.accept(len(draft))  # all accepted
        history = history + draft + [TEXT[(len(history) + len(draft)) % 50]]
    assert lengths == [2, 4, 8, 16]  # doubled after each whole acceptance, up to the lookup's n_max
    draft = _step(auto, history)
    assert len(draft) == 16
    auto.accept(0)  # rejected at the first slot
    assert auto.lookup_cap == 2
    history = history + [999]  # the target wrote something else
    history = history + TEXT[:8]
    assert len(_step(auto, history)) <= 2  # the next guess is short again


def test_partial_acceptance_sets_the_cap_to_twice_the_run():
    auto = _auto_with_costs()
    auto.begin(TEXT)
    auto.lookup_cap = 16
    history = TEXT + TEXT[:6]
    draft = _step(auto, history)
    assert len(draft) == 16
    auto.accept(3)
    assert auto.lookup_cap == 6
