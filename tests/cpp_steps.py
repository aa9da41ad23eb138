"""Step-by-step comparison with llama.cpp's C++ driver: what our loop drafted and accepted per step,
and the driver's steps that our loop also takes (see `CppResult.within_budget`)."""

from __future__ import annotations

from typing import Sequence


class StepRecorder:
    """Wraps the engine's proposer and records (accepted, drafted) of every step."""

    def __init__(self, inner):
        self.inner = inner
        self.steps: list[tuple[int, int]] = []
        self._drafted = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, *args, **kwargs):
        draft = self.inner.propose(*args, **kwargs)
        if not kwargs.get("shadow"):
            self._drafted = len(draft)
        return draft

    def accept(self, n_accepted):
        self.steps.append((n_accepted, self._drafted))
        self._drafted = 0
        self.inner.accept(n_accepted)


def steps_within_budget(steps: Sequence[tuple[int, int]], n_predict: int) -> list[tuple[int, int]]:
    """The driver's (accepted, drafted) steps before its budget's last step, which our loop
    takes differently: it runs one step past n_predict, and reads a cap of 0 as no cap."""
    theirs, n = [], 0
    for a, d in steps:
        if n >= n_predict or (d > 0 and n_predict - n - 1 <= 0):
            break
        theirs.append((a, d))
        n += a + 1
    return theirs
