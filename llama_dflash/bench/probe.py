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

from ..engine import LlamaDFlashDecoding, OrdinaryDecoding
from ..proposers.factory import draft_model_ceiling
from ..stats import SpecStats
from .costmodel import StepCosts

__all__ = ["probe_step_costs"]


def probe_step_costs(dec: LlamaDFlashDecoding, prompt: Sequence[int], ks: Sequence[int], repeats: int = 5,
                     ordinary: Optional[OrdinaryDecoding] = None) -> Optional[StepCosts]:
    """Median seconds of verify(k+1 rows) and draft(k) for each k, and of one ordinary decode on
    `ordinary`'s context in the same rounds (so that all share one time window); None for
    recurrent targets."""
    if dec.rewinder.mode != "kv" or not ks or repeats < 1:
        return None
    res = dec.generate(list(prompt), 1)  # both caches now hold the prompt
    if not res.tokens:
        return None
    n_past, tok = len(prompt), res.tokens[0]
    if ordinary is not None:
        ordinary.generate(list(prompt), 1)
        ordinary.forget_cache()
    target, proposer = dec.target, dec._draft
    saved = proposer.stats, proposer.n_max, proposer.n_min
    proposer.stats, proposer.n_max, proposer.n_min = SpecStats(), draft_model_ceiling(dec.draft_info), 0
    ks = [k for k in ks if n_past + k + 1 <= target.n_ctx]

    def verify(k: int) -> None:
        target.decode([tok] * (k + 1), n_past, logits="all")
        target.logits_row(0)
        target.seq_rm(n_past)

    def draft(k: int) -> None:
        proposer.propose(tok, n_past, k)

    def decode(_k: int) -> None:
        ordinary.target.decode([tok], n_past, logits="last")
        ordinary.target.logits_row(0)
        ordinary.target.seq_rm(n_past)

    steps = [("verify", verify), ("draft", draft)] + ([("ordinary", decode)] if ordinary is not None else [])
    times: dict[str, dict[int, list[float]]] = {name: {k: [] for k in ks} for name, _ in steps}
    try:
        # round-robin over k, first round discarded (first use of a batch shape, queued injection):
        # load that drifts during the probe then weighs on every k alike
        for r in range(repeats + 1):
            for k in ks:
                for name, fn in steps:
                    t0 = time.perf_counter()
                    fn(k)
                    if r:
                        times[name][k].append(time.perf_counter() - t0)
    finally:
        proposer.stats, proposer.n_max, proposer.n_min = saved
        dec.forget_cache()
    ords = [t for v in times.get("ordinary", {}).values() for t in v]
    return StepCosts(draft={k: statistics.median(v) for k, v in times["draft"].items()},
                     verify={k: statistics.median(v) for k, v in times["verify"].items()}, source="probe",
                     ordinary=statistics.median(ords) if ords else None)
