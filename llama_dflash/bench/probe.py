"""Time the k-dependent parts of a speculative step in isolation, on the engine's own contexts.

One measured run gives the costs of one draft length only; the cost model needs them for every k.
Right after the prompt, this decodes k+1 verify rows (logits on every row, layer inputs captured,
the first logits row read, as the loop does) and drafts one block of k tokens, a few times each,
and removes what it decoded.  Recurrent targets are skipped (their cache cannot simply be cut).
"""

from __future__ import annotations

import statistics
import time
from typing import Optional, Sequence

from ..engine import LlamaDFlashDecoding
from ..stats import SpecStats
from .costmodel import StepCosts

__all__ = ["probe_step_costs"]


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up: first use of a batch shape, queued feature injection
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_step_costs(dec: LlamaDFlashDecoding, prompt: Sequence[int], ks: Sequence[int],
                     repeats: int = 5) -> Optional[StepCosts]:
    """Median seconds of verify(k+1 rows) and draft(k) for each k; None for recurrent targets."""
    if dec.rewinder.mode != "kv" or not ks:
        return None
    res = dec.generate(list(prompt), 1)  # both caches now hold the prompt
    if not res.tokens:
        return None
    n_past, tok = len(prompt), res.tokens[0]
    target, proposer = dec.target, dec._dflash
    saved = proposer.stats, proposer.n_max, proposer.n_min
    proposer.stats, proposer.n_max, proposer.n_min = SpecStats(), dec.draft_info.max_draft_tokens, 0
    costs = StepCosts(source="probe")
    try:
        for k in ks:
            if n_past + k + 1 > target.n_ctx:
                break

            def verify(k: int = k) -> None:
                target.decode([tok] * (k + 1), n_past, logits="all")
                target.logits_row(0)
                target.seq_rm(n_past)

            costs.verify[k] = _median_time(verify, repeats)
            costs.draft[k] = _median_time(lambda k=k: proposer.propose(tok, n_past, k), repeats)
    finally:
        proposer.stats, proposer.n_max, proposer.n_min = saved
        dec.forget_cache()
    return costs
