"""The two interfaces of drafting: what the generation loop calls, and what a token-only drafter is.

`Proposer` is what `generate.speculative_generate` and `speculator.Speculator` drive: a draft model
(features injected into its cache, a cache to roll back) or a chain of drafters.  `TokenDrafter`
is the narrower interface of a drafter that needs nothing but the token history -- llama.cpp's
n-gram speculators and our own lookup -- with llama.cpp's `common_speculative_impl` life cycle:
`begin` once per generation, `draft` at every step, `accept` after every verification.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

__all__ = ["Proposer", "TokenDrafter"]


class Proposer(Protocol):
    """What the generation loop needs from a draft.

    `history` holds the tokens at positions 0..n_past-1 (the target cache's committed tokens);
    `id_last` is the token at n_past, sampled but not decoded yet.  Within a generation the history
    only grows; `begin` starts a new one.  `accept` follows every verification step (also steps
    that drafted nothing, as llama.cpp's driver does)."""

    n_max: int

    def begin(self, prompt: Sequence[int]) -> None: ...

    def inject(self, features: np.ndarray, pos0: int) -> None: ...

    def propose(self, id_last: int, n_past: int, n: int, *, shadow: bool = False,
                history: Sequence[int] = ()) -> list[int]: ...

    def accept(self, n_accepted: int) -> None: ...

    def rollback(self, n_past: int) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class TokenDrafter(Protocol):
    """A drafter that reads only tokens (no model, no cache).

    `name` is llama.cpp's `--spec-type` name (or ours); `n_max` the longest draft it returns.
    `draft(history, id_last)` gets the committed tokens (a list or a 1-D integer array, positions
    0..n-1) and the token just sampled, and returns the tokens it expects after `id_last` (empty:
    no opinion).  `accept(n_accepted, is_other)` reports the step's verification: is_other is True
    when another drafter's draft (or none) was verified."""

    name: str
    n_max: int

    def begin(self, prompt: Sequence[int]) -> None: ...

    def draft(self, history: Sequence[int], id_last: int) -> list[int]: ...

    def accept(self, n_accepted: int, is_other: bool) -> None: ...
