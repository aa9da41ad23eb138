"""Where a speculative step's time goes, and what speedup the measured costs and acceptance allow.

A step that drafts k tokens costs  draft(k) + verify(k+1 rows) + extras  (injection, sampling,
our Python loop) and yields  tau(k) = 1 + sum of the per-position acceptance over the first k
slots  tokens; ordinary decoding costs t_ord per token.  So the speedup at k is
tau(k) * t_ord / step(k), and with every draft token right it would be (k+1) * t_ord / step(k).
Everything here is arithmetic on measured numbers (see `probe` for how draft/verify are timed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ..stats import SpecStats

__all__ = ["PHASES", "StepCosts", "Prediction", "CostModel", "phase_table", "ordinary_unit", "build_cost_model",
           "speedup_line", "cost_model_dict"]

#: Phases of a step, in the order tables print them.
PHASES = ("draft", "inject", "verify", "sample", "rollback", "python")


@dataclass
class StepCosts:
    """Seconds per step of the two parts that grow with k: one draft block and one verify of k+1 rows."""

    draft: dict[int, float] = field(default_factory=dict)
    verify: dict[int, float] = field(default_factory=dict)
    source: str = "probe"  # "probe": timed in isolation; "runs": per-step means of the measured runs
    ordinary: Optional[float] = None  # one ordinary decode + sync, timed in the same probe rounds

    def ks(self) -> list[int]:
        return sorted(set(self.draft) & set(self.verify))


@dataclass
class Prediction:
    k: int
    tokens_per_step: float  # tau(k) predicted from the per-position acceptance
    step_cost: float  # one step, in ordinary tokens (multiples of t_ord)
    speedup: float  # tau(k) / step_cost
    ceiling: float  # (k + 1) / step_cost: every draft token accepted


@dataclass
class CostModel:
    ordinary_seconds: float  # t_ord: one ordinary token, decode loop only (prefill excluded)
    predictions: list[Prediction]
    costs_source: str = "probe"

    @property
    def best(self) -> Optional[Prediction]:
        return max(self.predictions, key=lambda p: p.speedup) if self.predictions else None

    @property
    def best_ceiling(self) -> Optional[Prediction]:
        return max(self.predictions, key=lambda p: p.ceiling) if self.predictions else None

    def prediction(self, k: Any) -> Optional[Prediction]:
        return next((p for p in self.predictions if p.k == k), None)

    @property
    def verdict(self) -> str:
        """One sentence: can some k win here, and if not, is acceptance or verification cost the cause."""
        best, top = self.best, self.best_ceiling
        if best is None or top is None:
            return "no prediction (no draft length with measured costs and acceptance)"
        if best.speedup > 1.0:
            return f"drafting pays: best predicted k={best.k} ({best.speedup:.2f}x)"
        if top.ceiling <= 1.0:
            return (f"no draft length can win: verification cost. Even a draft that is always right would reach "
                    f"at most {top.ceiling:.2f}x (k={top.k}: one step costs {top.step_cost:.2f} ordinary tokens "
                    f"for at most {top.k + 1} tokens)")
        need = min(self.predictions, key=lambda p: p.step_cost - p.tokens_per_step)
        return (f"no draft length wins with this draft: acceptance. A perfect draft would reach {top.ceiling:.2f}x "
                f"at k={top.k}; at k={need.k} a step costs {need.step_cost:.2f} ordinary tokens, so it needs "
                f"more than {need.step_cost:.2f} tokens per step, and this draft gives {need.tokens_per_step:.2f}")

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "ordinary_seconds_per_token": self.ordinary_seconds,
            "costs_source": self.costs_source,
            "predictions": [asdict(p) for p in self.predictions],
            "best_k": best.k if best else None,
            "best_predicted_speedup": best.speedup if best else None,
            "verdict": self.verdict,
        }


def _loop_seconds(s: SpecStats) -> float:
    return max(0.0, s.total_seconds - s.prefill_seconds)


def ordinary_unit(ordinary: SpecStats) -> float:
    """T1: seconds of one ordinary target decode + sync (the unit of the per-phase table)."""
    return ordinary.target_seconds / ordinary.verification_steps if ordinary.verification_steps else 0.0


def phase_table(ordinary: SpecStats, runs: dict[Any, SpecStats]) -> dict[str, Any]:
    """Per-step phase costs as multiples of T1 for the ordinary loop and every draft length."""
    unit = ordinary_unit(ordinary)

    def row(s: SpecStats) -> dict[str, float]:
        steps = max(1, s.verification_steps)
        out = {p: (v / steps / unit if unit else 0.0) for p, v in s.phase_seconds().items()}
        out["total"] = sum(out.values())
        out["tokens_per_step"] = s.generated_tokens / steps if s.verification_steps else 0.0
        return out

    return {"unit_seconds": unit, "ordinary": row(ordinary), "draft_tokens": {str(k): row(s) for k, s in runs.items()}}


def _extras_per_step(s: SpecStats) -> float:
    """Seconds per step outside draft and verify: injection, sampling, rollback, Python."""
    ph = s.phase_seconds()
    return (sum(ph.values()) - ph["draft"] - ph["verify"]) / max(1, s.verification_steps)


def run_step_costs(runs: dict[Any, SpecStats]) -> StepCosts:
    """Draft/verify costs per step from fixed-length runs (when no probe could be taken)."""
    c = StepCosts(source="runs")
    for k, s in runs.items():
        if isinstance(k, int) and s.verification_steps and s.draft_steps:
            c.draft[k] = s.draft_seconds / s.draft_steps
            c.verify[k] = s.target_seconds / s.verification_steps
    return c


def build_cost_model(ordinary: SpecStats, runs: dict[Any, SpecStats], costs: StepCosts) -> CostModel:
    """Predict the speedup of every k with measured costs, from the measured acceptance.

    t_ord, one ordinary token, is the probe's ordinary decode (same time window as the probed
    draft/verify costs) plus the ordinary loop's sampling and Python time per token, or without a
    probe the ordinary loop's time per token.  Acceptance at k comes from the run at k when there
    is one, else from the run that drafted the most positions; extras (injection, sampling,
    Python) likewise, else their mean over the runs.
    """
    t_ord = _loop_seconds(ordinary) / ordinary.generated_tokens if ordinary.generated_tokens else 0.0
    if costs.ordinary and ordinary.verification_steps:
        # the probe's decode with the ordinary loop's own per-token extras (sampling, Python)
        t_ord = costs.ordinary + max(0.0, t_ord - ordinary.target_seconds / ordinary.verification_steps)
    measured = {k: s for k, s in runs.items() if s.verification_steps}
    if t_ord <= 0 or not measured:
        return CostModel(t_ord, [], costs.source)
    widest = max(measured.values(), key=lambda s: len(s.acceptance_per_position))
    mean_extra = sum(_extras_per_step(s) for s in measured.values()) / len(measured)
    preds = []
    for k in costs.ks():
        s = measured.get(k)
        acc = (s if s is not None and len(s.acceptance_per_position) >= k else widest).acceptance_per_position
        if len(acc) < k:
            continue  # nobody drafted that far: acceptance unknown
        extra = _extras_per_step(s) if s is not None else mean_extra
        step = (costs.draft[k] + costs.verify[k] + extra) / t_ord
        tau = 1.0 + sum(acc[:k])
        preds.append(Prediction(k, tau, step, tau / step, (k + 1) / step))
    return CostModel(t_ord, preds, costs.source)


def speedup_line(model: CostModel, measured: dict[Any, float]) -> str:
    """`predicted 0.81x at k=2, measured 0.79x` (measured: the best measured setting)."""
    best = model.best
    if best is None:
        return "no prediction"
    if not measured:
        return f"predicted {best.speedup:.2f}x at k={best.k}, nothing measured"
    k_meas, s_meas = max(measured.items(), key=lambda kv: kv[1])
    same = measured.get(best.k)
    text = f"predicted {best.speedup:.2f}x at k={best.k}, measured {s_meas:.2f}x at {_k(k_meas)}"
    if same is not None and k_meas != best.k:
        text += f" ({same:.2f}x at k={best.k})"
    return text


def _k(k: Any) -> str:
    return "adaptive" if k == "auto" else f"k={k}"  # --draft-tokens auto: the adaptive length


def cost_model_dict(model: CostModel, measured: dict[Any, float], oracle: dict[Any, float]) -> dict[str, Any]:
    """The model's JSON with the measured decode-loop speedups (and oracle's) beside the predictions."""
    return {**model.to_dict(), "measured_decode_speedup": {str(k): v for k, v in measured.items()},
            "oracle_decode_speedup": {str(k): v for k, v in oracle.items()}, "summary": speedup_line(model, measured)}
