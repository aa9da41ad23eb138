"""The oracle: a draft that is always right, at the real draft's cost.

It replays the ordinary run's tokens as the proposals while the real draft block still runs
(`ScriptedProposer`), so its speedup is the measured ceiling of this pair at that draft length:
what a perfect draft would give with today's costs.  With greedy sampling every proposal is
accepted; with temperature > 0 the ordinary run is one sample, so acceptance stays below 100%.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

from ..engine import LlamaDFlashDecoding
from ..proposers import ScriptedProposer

__all__ = ["oracle_script", "oracle_proposals"]


def oracle_script(prompt_len: int, reference: Sequence[int]):
    """script(n_past, n) for ScriptedProposer: the reference tokens after position n_past.

    The last committed token sits at n_past, so the first proposal is generated token
    n_past + 1 - prompt_len (the first generated token is at position prompt_len)."""
    ref = list(reference)

    def script(n_past: int, n: int) -> list[int]:
        start = n_past + 1 - prompt_len
        return ref[start : start + n] if start >= 0 else []

    return script


@contextmanager
def oracle_proposals(dec: LlamaDFlashDecoding, prompt_len: int, reference: Sequence[int]) -> Iterator[None]:
    """Within the block, `dec` proposes the reference tokens (its real draft still decodes)."""
    real = dec.proposer
    if real is None:
        raise RuntimeError("LlamaDFlashDecoding is closed")
    dec.use_proposer(ScriptedProposer(real, oracle_script(prompt_len, reference)))
    try:
        yield
    finally:
        dec.use_proposer(real)
