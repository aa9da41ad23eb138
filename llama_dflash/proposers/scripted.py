"""`ScriptedProposer`: a real draft's cache work with scripted tokens, to drive every accepted
length in tests and in the oracle benchmark (an always-right draft)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .dflash import DFlashProposer

__all__ = ["ScriptedProposer"]


class ScriptedProposer:
    """Runs the inner proposer (keeping its cache work identical) but proposes scripted tokens.

    `script(n_past, n)` returns the tokens to propose for a block at n_past.
    """

    def __init__(self, inner: DFlashProposer, script: Callable[[int, int], Sequence[int]]):
        self.inner = inner
        self.script = script
        self.n_max = inner.n_max

    def inject(self, features: np.ndarray, pos0: int) -> None:
        self.inner.inject(features, pos0)

    def begin(self, prompt: Sequence[int]) -> None:
        self.inner.begin(prompt)

    def accept(self, n_accepted: int) -> None:
        self.inner.accept(n_accepted)

    def propose(self, id_last: int, n_past: int, n: int, *, shadow: bool = False,
                history: Sequence[int] = ()) -> list[int]:
        real = self.inner.propose(id_last, n_past, n, shadow=shadow)
        tokens = [int(t) for t in self.script(n_past, min(n, self.n_max))][: min(n, self.n_max)]
        if shadow:
            self.inner.stats.shadow_drafted += len(tokens) - len(real)
        else:
            self.inner.stats.drafted += len(tokens) - len(real)
        return tokens

    def rollback(self, n_past: int) -> None:
        self.inner.rollback(n_past)

    def clear(self) -> None:
        self.inner.clear()

    def pos_max(self) -> int:
        return self.inner.pos_max()

    def close(self) -> None:
        self.inner.close()
