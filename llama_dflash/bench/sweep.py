"""Draft-length and generation-length sweeps over workloads, with one loaded model pair.

For every workload and max-tokens value, each measured round runs the ordinary baseline and then
every draft length (interleaved, so drift hits all settings alike).  The best setting is the one
with the highest sustained throughput, not the highest acceptance.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Optional

from .._llama import Model, recent_log_messages
from ..config import SpecConfig, TargetConfig
from ..engine import LlamaDFlashDecoding, OrdinaryDecoding
from ..proposers.factory import draft_model_ceiling
from ..sampling import SamplingParams
from ..stats import SpecStats
from .backend import BackendInfo, backend_info
from .costmodel import CostModel, StepCosts, build_cost_model, cost_model_dict, phase_table, run_step_costs
from .format import format_cost_model, format_phases, format_speculators
from .probe import probe_step_costs
from .runner import (ModeResult, RunResult, draft_length_settable, first_divergence, merge_speculators, oracle_supported,
                     raise_context, run_oracle, skipped_notes, timed_run)

__all__ = ["SweepConfig", "SweepCell", "SweepResult", "run_sweep", "format_sweep", "setting_label", "DEFAULT_LABEL"]


@dataclass
class SweepConfig:
    target: TargetConfig
    spec: SpecConfig
    workloads: dict[str, list[str]]  # name -> prompts (already chat-wrapped)
    draft_tokens: list[int]
    max_tokens: list[int]
    runs: int = 2
    warmup_tokens: int = 32
    ignore_eos: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    oracle: bool = False  # also run the oracle at every fixed draft length
    probe: bool = True  # time verify/draft of every k in isolation for the cost model
    # what `generate` and `serve` run by default (`--spec-type auto` over the same draft), measured
    # beside the draft's own lengths in every round; None: not measured
    default_spec: Optional[SpecConfig] = None

    def __post_init__(self) -> None:
        if not self.workloads or any(not p for p in self.workloads.values()):
            raise ValueError("every workload needs at least one prompt")
        if not self.draft_tokens or any(k != "auto" and (not isinstance(k, int) or k < 1) for k in self.draft_tokens):
            raise ValueError(f"--sweep-draft-tokens values must be >= 1, not {self.draft_tokens}")
        if not self.max_tokens or any(n < 1 for n in self.max_tokens):
            raise ValueError(f"--sweep-max-tokens values must be >= 1, not {self.max_tokens}")
        if self.runs < 1:
            raise ValueError(f"runs must be >= 1, not {self.runs}")


@dataclass
class SweepCell:
    """One (workload, max_tokens) group: the baseline and every draft length."""

    workload: str
    max_tokens: int
    ordinary: ModeResult
    speculative: dict  # draft tokens actually used (int or "auto") -> result
    oracle: dict = field(default_factory=dict)  # fixed draft length -> oracle result (--oracle)
    step_costs: Optional[StepCosts] = None
    default: Optional[ModeResult] = None  # `--spec-type auto`, the default of generate and serve

    def default_speedup(self) -> Optional[float]:
        base = self.ordinary.aggregate_tokens_per_second
        return self.default.aggregate_tokens_per_second / base if self.default is not None and base else None

    def speedup(self, k: int) -> float:
        base = self.ordinary.aggregate_tokens_per_second
        return self.speculative[k].aggregate_tokens_per_second / base if base else 0.0

    def decode_speedups(self) -> tuple[dict[Any, float], dict[Any, float]]:
        """Decode-loop speedups (prefill excluded) of every draft length and every oracle run."""
        base = self.ordinary.decode_tokens_per_second
        if not base:
            return {}, {}
        return ({k: m.decode_tokens_per_second / base for k, m in self.speculative.items()},
                {k: m.decode_tokens_per_second / base for k, m in self.oracle.items()})

    def oracle_speedup(self, k: Any) -> Optional[float]:
        base = self.ordinary.aggregate_tokens_per_second
        return self.oracle[k].aggregate_tokens_per_second / base if k in self.oracle and base else None

    @property
    def fastest_draft_tokens(self) -> Any:
        return max(self.speculative, key=lambda k: self.speculative[k].aggregate_tokens_per_second)

    @property
    def oracle_ceiling(self) -> Optional[tuple[int, float]]:
        """(k, oracle speedup) at the fastest fixed draft length that has an oracle run."""
        fixed = [k for k in self.speculative if k in self.oracle]
        if not fixed:
            return None
        k = max(fixed, key=lambda k: self.speculative[k].aggregate_tokens_per_second)
        return k, self.oracle_speedup(k)

    def phase_table(self) -> dict[str, Any]:
        runs = {k: m.stats for k, m in self.speculative.items()}
        runs.update({f"oracle {k}": m.stats for k, m in self.oracle.items()})
        return phase_table(self.ordinary.stats, runs)

    def cost_model(self) -> CostModel:
        runs = {k: m.stats for k, m in self.speculative.items()}
        return build_cost_model(self.ordinary.stats, runs, self.step_costs or run_step_costs(runs))

    @property
    def best_draft_tokens(self) -> Optional[int]:
        """The fastest draft length, or None when no draft length beats ordinary decoding."""
        k = max(self.speculative, key=lambda k: self.speculative[k].aggregate_tokens_per_second)
        return k if self.speedup(k) > 1.0 else None

    def output_match(self, k: int) -> bool:
        return self.ordinary.runs[0].output_tokens == self.speculative[k].runs[0].output_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "max_tokens": self.max_tokens,
            "ordinary": self.ordinary.to_dict(),
            "speculative": {
                str(k): {
                    **m.to_dict(),
                    "speedup": self.speedup(k),
                    "output_tokens_match": self.output_match(k),
                    "first_divergence": first_divergence(self.ordinary.runs[0].output_tokens,
                                                         m.runs[0].output_tokens),
                }
                for k, m in self.speculative.items()
            },
            "best_draft_tokens": self.best_draft_tokens,
            "oracle": {str(k): {**m.to_dict(), "speedup": self.oracle_speedup(k)} for k, m in self.oracle.items()},
            "oracle_ceiling": (dict(zip(("draft_tokens", "speedup"), self.oracle_ceiling))
                               if self.oracle_ceiling else None),
            "phases": self.phase_table(),
            "cost_model": cost_model_dict(self.cost_model(), *self.decode_speedups()),
            **({"spec_type_auto": {
                **self.default.to_dict(), "speedup": self.default_speedup(),
                "output_tokens_match": self.ordinary.runs[0].output_tokens == self.default.runs[0].output_tokens,
                "first_divergence": first_divergence(self.ordinary.runs[0].output_tokens,
                                                     self.default.runs[0].output_tokens),
            }} if self.default is not None else {}),
        }


@dataclass
class SweepResult:
    config: SweepConfig
    algorithm: str
    cells: list[SweepCell]
    load_seconds: float
    warnings: list[str] = field(default_factory=list)
    step_costs: Optional[StepCosts] = None
    backend: Optional[BackendInfo] = None
    speculator_names: tuple[str, ...] = ()  # the engine's drafters, in priority order
    notes: list[str] = field(default_factory=list)  # what was skipped or changed, and why

    def to_dict(self) -> dict[str, Any]:
        spec = self.config.spec
        return {
            "algorithm": self.algorithm,
            "model": self.config.target.model,
            "draft_model": spec.draft_model,
            **({"spec_types": list(spec.spec_types), "speculators": list(self.speculator_names),
                "ngram_size_n": spec.ngram_size_n, "ngram_size_m": spec.ngram_size_m,
                "ngram_min_hits": spec.ngram_min_hits}
               if spec.spec_type is not None else {}),
            "n_ctx": self.config.target.n_ctx,
            "load_seconds": self.load_seconds,
            "step_costs": asdict(self.step_costs) if self.step_costs is not None else None,
            "backend": self.backend.to_dict() if self.backend is not None else None,
            "cells": [c.to_dict() for c in self.cells],
            "warnings": self.warnings,
            **({"notes": self.notes} if self.notes else {}),
        }


def _run_prompts(run_one: Callable[[int, list[int]], tuple[RunResult, SpecStats]], prompts: list[list[int]],
                 stats: Optional[SpecStats], tick: Callable[[], None],
                 speculators: Optional[dict] = None) -> tuple[RunResult, list[list[int]]]:
    """Every prompt once through run_one(index, prompt); the runs summed (statistics into `stats`,
    per-speculator counts into `speculators`), and each prompt's tokens."""
    tokens: list[int] = []
    outputs: list[list[int]] = []
    seconds = decode = 0.0
    finish = None
    accepted = drafted = None
    for i, prompt in enumerate(prompts):
        run, s = run_one(i, prompt)
        seconds += run.seconds
        decode += run.decode_seconds or 0.0
        tokens += run.output_tokens
        outputs.append(run.output_tokens)
        finish = run.finish_reason
        if run.accepted is not None:
            accepted, drafted = (accepted or 0) + run.accepted, (drafted or 0) + (run.drafted or 0)
        if stats is not None:
            stats.merge(s)
        if speculators is not None:
            merge_speculators(speculators, s)
        tick()
    n = len(tokens)
    return RunResult(n, seconds, n / seconds if seconds > 0 else 0.0, tokens, finish, accepted=accepted,
                     drafted=drafted, decode_seconds=decode), outputs


def run_sweep(cfg: SweepConfig, progress: Optional[Any] = None) -> SweepResult:
    """`progress`: an object with update(n) (e.g. a tqdm bar) or None."""
    import warnings as _warnings

    tick = (lambda: progress.update(1)) if progress is not None else (lambda: None)
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        t0 = time.perf_counter()
        model = Model(cfg.target.model, n_gpu_layers=cfg.target.n_gpu_layers, repack=cfg.target.repack,
                      load_mtp=cfg.spec.uses_mtp)
        try:
            notes = fit_context(cfg, model)
            with LlamaDFlashDecoding(cfg.target, cfg.spec, model=model) as spec_dec, \
                    OrdinaryDecoding(cfg.target, model=model) as ord_dec, \
                    _default_engine(cfg, model) as default_dec:
                load = time.perf_counter() - t0
                notes += skipped_notes(spec_dec, cfg.oracle, cfg.probe)
                cells = _sweep(cfg, spec_dec, ord_dec, tick, notes, default_dec)
                costs = None
                if cfg.probe and spec_dec.draft_info is not None:
                    first = ord_dec.tokenize(next(iter(cfg.workloads.values()))[0])
                    costs = probe_step_costs(spec_dec, first, range(1, draft_model_ceiling(spec_dec.draft_info) + 1),
                                             ordinary=ord_dec)
                for cell in cells:
                    cell.step_costs = costs
                algorithm = spec_dec.algorithm
                names = spec_dec.speculator_names
        finally:
            model.close()
    warnings = [str(w.message) for w in caught] + [f"llama.cpp {lvl}: {m}" for lvl, m in recent_log_messages()]
    return SweepResult(cfg, algorithm, cells, load, warnings, step_costs=costs, backend=backend_info(),
                       speculator_names=names, notes=notes)


@contextlib.contextmanager
def _default_engine(cfg: SweepConfig, model: Model) -> Iterator[Optional[LlamaDFlashDecoding]]:
    """The `--spec-type auto` engine on the same model, or None when the sweep does not measure it."""
    if cfg.default_spec is None:
        yield None
        return
    with LlamaDFlashDecoding(cfg.target, cfg.default_spec, model=model) as dec:
        yield dec


def setting_label(k: Any) -> str:
    """A draft-length setting named for what it is: k=N (fixed) or adaptive (--draft-tokens auto)."""
    return "adaptive" if k == "auto" else f"k={k}"


#: the row of `--spec-type auto` (the per-step choice of speculator, the default of generate and serve)
DEFAULT_LABEL = "spec-type auto"


def fit_context(cfg: SweepConfig, model: Model) -> list[str]:
    """Where the longest prompt plus the largest max_tokens does not fit in n_ctx (a prompt longer
    than n_ctx would end the sweep with an error, the built-in copy-heavy prompts are long; a
    generation past it would stop early), raise `cfg.target.n_ctx` to hold both; a note says so."""
    longest, where = 0, ""
    for name, prompts in cfg.workloads.items():
        for i, p in enumerate(prompts):
            n = len(model.tokenize(p))
            if n > longest:
                longest, where = n, f"workload {name}, prompt {i + 1}"
    return raise_context(cfg, longest, where, max(cfg.max_tokens))


def sweep_steps(cfg: SweepConfig) -> int:
    """Number of generations a sweep runs (for a progress bar)."""
    n_prompts = sum(len(p) for p in cfg.workloads.values())
    fixed = len({k for k in cfg.draft_tokens if k != "auto"}) if cfg.oracle else 0
    per_round = 1 + len(set(cfg.draft_tokens)) + fixed + (cfg.default_spec is not None)
    warm = 2 if cfg.warmup_tokens else 0
    return n_prompts * len(cfg.max_tokens) * per_round * cfg.runs + warm


def _sweep(cfg: SweepConfig, spec_dec: LlamaDFlashDecoding, ord_dec: OrdinaryDecoding,
           tick: Callable[[], None], notes: Optional[list[str]] = None,
           default_dec: Optional[LlamaDFlashDecoding] = None) -> list[SweepCell]:
    encoded = {name: [ord_dec.tokenize(p) for p in prompts] for name, prompts in cfg.workloads.items()}
    if cfg.warmup_tokens:
        first = next(iter(encoded.values()))[0]
        ord_dec.generate(first, cfg.warmup_tokens, cfg.sampling, ignore_eos=cfg.ignore_eos)
        tick()
        spec_dec.generate(first, cfg.warmup_tokens, cfg.sampling, ignore_eos=cfg.ignore_eos)
        tick()
        if default_dec is not None:
            default_dec.generate(first, cfg.warmup_tokens, cfg.sampling, ignore_eos=cfg.ignore_eos)
    settable = draft_length_settable(spec_dec)
    if settable:
        # clamp once so that duplicates (e.g. 8 and 16 on a block of 8) are measured once
        ks = sorted({spec_dec.set_draft_n_max(k) for k in cfg.draft_tokens},
                    key=lambda k: (k == "auto", str(k).zfill(4)))
    else:
        # token drafters (and auto) draft as long as they find: one setting, labelled by their longest draft
        ks = [spec_dec.draft_n_max]
        ignored = sorted({str(k) for k in cfg.draft_tokens} - {str(spec_dec.draft_n_max), str(cfg.spec.draft_n_max)})
        if ignored and notes is not None:
            notes.append(f"draft length not swept ({', '.join(ignored)} ignored): {','.join(spec_dec.speculator_names)} "
                         f"sets its own, up to {spec_dec.draft_n_max}")
    oracle_ks = [k for k in ks if k != "auto"] if cfg.oracle and oracle_supported(spec_dec) else []
    cells: list[SweepCell] = []
    for name, prompts in encoded.items():
        for max_tokens in cfg.max_tokens:
            ordinary = ModeResult("ordinary", stats=SpecStats(algorithm="ordinary"))
            spec = {k: ModeResult(spec_dec.algorithm, stats=SpecStats(algorithm=spec_dec.algorithm, draft_n_max=k))
                    for k in ks}
            oracle = {k: ModeResult("oracle", stats=SpecStats(algorithm=spec_dec.algorithm, draft_n_max=k))
                      for k in oracle_ks}
            default = None if default_dec is None else ModeResult(
                default_dec.algorithm, stats=SpecStats(algorithm=default_dec.algorithm))
            for _ in range(cfg.runs):
                run, refs = _run_prompts(lambda i, p: timed_run(ord_dec, p, cfg, max_tokens), prompts,
                                         ordinary.stats, tick)
                ordinary.runs.append(run)
                if default is not None:
                    default.runs.append(_run_prompts(lambda i, p: timed_run(default_dec, p, cfg, max_tokens),
                                                     prompts, default.stats, tick, default.speculators)[0])
                for k in ks:
                    if settable:
                        spec_dec.set_draft_n_max(k)
                    spec[k].runs.append(_run_prompts(lambda i, p: timed_run(spec_dec, p, cfg, max_tokens),
                                                     prompts, spec[k].stats, tick, spec[k].speculators)[0])
                for k in oracle_ks:
                    oracle[k].runs.append(_run_prompts(
                        lambda i, p, k=k: run_oracle(spec_dec, k, p, refs[i], cfg, max_tokens),
                        prompts, oracle[k].stats, tick, oracle[k].speculators)[0])
            cells.append(SweepCell(name, max_tokens, ordinary, spec, oracle, default=default))
    return cells


def format_sweep(res: SweepResult) -> str:
    lines: list[str] = []
    if res.backend is not None:
        lines += [f"Backend        : {res.backend.summary()}", ""]
    if res.config.spec.spec_type is not None:
        spec = res.config.spec
        lines += [f"Spec types     : {','.join(res.speculator_names or spec.spec_types)}",
                  f"Draft model    : {spec.draft_model or 'none'}", ""]
    lines += [f"Note           : {n}" for n in res.notes]
    if res.notes:
        lines.append("")
    for cell in res.cells:
        lines.append(f"[sweep: workload {cell.workload}, {cell.max_tokens} tokens, {res.config.runs} runs]")
        w = max([len("ordinary"), len(DEFAULT_LABEL) if cell.default is not None else 0]
                + [len(setting_label(k)) for k in cell.speculative])
        lines.append(f"  {'setting':<{w}} {'token/s':>9} {'median':>9} {'speedup':>8} {'accept':>7} "
                     f"{'tau':>5} {'acc/step':>8} {'rollbacks':>9} {'oracle':>7}  match")
        o = cell.ordinary
        lines.append(f"  {'ordinary':<{w}} {o.aggregate_tokens_per_second:9.2f} {o.median_tokens_per_second:9.2f} "
                     f"{1.0:8.3f} {'-':>7} {'-':>5} {'-':>8} {'-':>9} {'-':>7}  -")

        def row(label: str, m: ModeResult, speedup: float, orc: Optional[float], match: bool) -> str:
            s = m.stats
            return (f"  {label:<{w}} {m.aggregate_tokens_per_second:9.2f} {m.median_tokens_per_second:9.2f} "
                    f"{speedup:8.3f} {100 * s.acceptance_rate:6.1f}% {s.tokens_per_step:5.2f} "
                    f"{s.accepted_per_step:8.2f} {s.rollbacks:9d} {f'{orc:.3f}' if orc is not None else '-':>7}  "
                    f"{match}")

        if cell.default is not None:
            d = cell.default
            lines.append(row(DEFAULT_LABEL, d, cell.default_speedup() or 0.0, None,
                             o.runs[0].output_tokens == d.runs[0].output_tokens))
        for k, m in cell.speculative.items():
            lines.append(row(setting_label(k), m, cell.speedup(k), cell.oracle_speedup(k), cell.output_match(k)))
        lines.append("  (" + (f"{DEFAULT_LABEL}: what generate and serve run by default, per step the lookup, the "
                              "draft or no draft; " if cell.default is not None else "")
                     + "k=N: the draft alone at a fixed draft length; adaptive: the draft alone, its length chosen "
                     "every step (--draft-tokens auto))")
        lines.append("  (tau: tokens per verification step = accepted + 1; acc/step: accepted drafts per step; "
                     "oracle: speedup with every draft token right, measured)")
        if cell.default is not None and cell.default.speculators:
            lines += format_speculators(cell.default.speculators, DEFAULT_LABEL)
        for k, m in cell.speculative.items():
            if m.speculators:
                lines += format_speculators(m.speculators, setting_label(k))
        best = cell.best_draft_tokens
        if best is None:
            lines.append("  best draft length   : none (ordinary decoding was faster than every draft length)")
        else:
            lines.append(f"  best draft length   : {setting_label(best)} ({cell.speedup(best):.3f}x)")
        if cell.default is not None:
            lines.append(f"  by default          : {DEFAULT_LABEL} ({cell.default_speedup() or 0.0:.3f}x), what "
                         "`llama-dflash generate` and `serve` run")
        ceiling = cell.oracle_ceiling
        if ceiling is not None:
            k, x = ceiling
            lines.append(f"  oracle ceiling      : {x:.3f}x at {setting_label(k)} (fastest fixed draft length; "
                         f"measured {cell.speedup(k):.3f}x)")
        lines += ["", *format_phases(cell.phase_table()), ""]
        lines += [*format_cost_model(cell.cost_model(), *cell.decode_speedups()), ""]
    return "\n".join(lines).rstrip()
