"""Draft-length and generation-length sweeps over workloads, with one loaded model pair.

For every workload and max-tokens value, each measured round runs the ordinary baseline and then
every draft length (interleaved, so drift hits all settings alike).  The best setting is the one
with the highest sustained throughput, not the highest acceptance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .._llama import Model, recent_log_messages
from ..config import SpecConfig, TargetConfig
from ..engine import LlamaDFlashDecoding, OrdinaryDecoding
from ..sampling import SamplingParams
from ..stats import SpecStats
from .runner import ModeResult, RunResult, first_divergence

__all__ = ["SweepConfig", "SweepCell", "SweepResult", "run_sweep", "format_sweep"]


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

    def speedup(self, k: int) -> float:
        base = self.ordinary.aggregate_tokens_per_second
        return self.speculative[k].aggregate_tokens_per_second / base if base else 0.0

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
        }


@dataclass
class SweepResult:
    config: SweepConfig
    algorithm: str
    cells: list[SweepCell]
    load_seconds: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "model": self.config.target.model,
            "draft_model": self.config.spec.draft_model,
            "load_seconds": self.load_seconds,
            "cells": [c.to_dict() for c in self.cells],
            "warnings": self.warnings,
        }


def _run_prompts(decoder: Any, prompts: list[list[int]], max_tokens: int, cfg: SweepConfig,
                 stats: Optional[SpecStats], tick: Callable[[], None]) -> RunResult:
    tokens: list[int] = []
    seconds = 0.0
    finish = None
    for prompt in prompts:
        t0 = time.perf_counter()
        res = decoder.generate(prompt, max_tokens, cfg.sampling, ignore_eos=cfg.ignore_eos)
        seconds += time.perf_counter() - t0
        tokens += res.tokens
        finish = res.finish_reason
        if stats is not None:
            stats.merge(res.stats)
        tick()
    n = len(tokens)
    return RunResult(n, seconds, n / seconds if seconds > 0 else 0.0, tokens, finish)


def run_sweep(cfg: SweepConfig, progress: Optional[Any] = None) -> SweepResult:
    """`progress`: an object with update(n) (e.g. a tqdm bar) or None."""
    import warnings as _warnings

    tick = (lambda: progress.update(1)) if progress is not None else (lambda: None)
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        t0 = time.perf_counter()
        model = Model(cfg.target.model, n_gpu_layers=cfg.target.n_gpu_layers, repack=cfg.target.repack)
        try:
            with LlamaDFlashDecoding(cfg.target, cfg.spec, model=model) as spec_dec, \
                    OrdinaryDecoding(cfg.target, model=model) as ord_dec:
                load = time.perf_counter() - t0
                cells = _sweep(cfg, spec_dec, ord_dec, tick)
                algorithm = spec_dec.algorithm
        finally:
            model.close()
    warnings = [str(w.message) for w in caught] + [f"llama.cpp {lvl}: {m}" for lvl, m in recent_log_messages()]
    return SweepResult(cfg, algorithm, cells, load, warnings)


def sweep_steps(cfg: SweepConfig) -> int:
    """Number of generations a sweep runs (for a progress bar)."""
    n_prompts = sum(len(p) for p in cfg.workloads.values())
    per_round = 1 + len(set(cfg.draft_tokens))
    warm = 2 if cfg.warmup_tokens else 0
    return n_prompts * len(cfg.max_tokens) * per_round * cfg.runs + warm


def _sweep(cfg: SweepConfig, spec_dec: LlamaDFlashDecoding, ord_dec: OrdinaryDecoding,
           tick: Callable[[], None]) -> list[SweepCell]:
    encoded = {name: [ord_dec.tokenize(p) for p in prompts] for name, prompts in cfg.workloads.items()}
    if cfg.warmup_tokens:
        first = next(iter(encoded.values()))[0]
        ord_dec.generate(first, cfg.warmup_tokens, cfg.sampling, ignore_eos=cfg.ignore_eos)
        tick()
        spec_dec.generate(first, cfg.warmup_tokens, cfg.sampling, ignore_eos=cfg.ignore_eos)
        tick()
    # clamp once so that duplicates (e.g. 8 and 16 on a block of 8) are measured once
    ks = sorted({spec_dec.set_draft_n_max(k) for k in cfg.draft_tokens}, key=lambda k: (k == "auto", str(k).zfill(4)))
    cells: list[SweepCell] = []
    for name, prompts in encoded.items():
        for max_tokens in cfg.max_tokens:
            ordinary = ModeResult("ordinary")
            spec = {k: ModeResult(spec_dec.algorithm, stats=SpecStats(algorithm=spec_dec.algorithm, draft_n_max=k))
                    for k in ks}
            for _ in range(cfg.runs):
                ordinary.runs.append(_run_prompts(ord_dec, prompts, max_tokens, cfg, None, tick))
                for k in ks:
                    spec_dec.set_draft_n_max(k)
                    m = spec[k]
                    m.runs.append(_run_prompts(spec_dec, prompts, max_tokens, cfg, m.stats, tick))
            cells.append(SweepCell(name, max_tokens, ordinary, spec))
    return cells


def format_sweep(res: SweepResult) -> str:
    lines: list[str] = []
    for cell in res.cells:
        lines.append(f"[sweep: workload {cell.workload}, {cell.max_tokens} tokens, {res.config.runs} runs]")
        lines.append(f"  {'draft':>5} {'token/s':>9} {'median':>9} {'speedup':>8} {'accept':>7} "
                     f"{'mean len':>8} {'rollbacks':>9}  match")
        o = cell.ordinary
        lines.append(f"  {'ord.':>5} {o.aggregate_tokens_per_second:9.2f} {o.median_tokens_per_second:9.2f} "
                     f"{1.0:8.3f} {'-':>7} {'-':>8} {'-':>9}  -")
        for k, m in cell.speculative.items():
            s = m.stats
            lines.append(
                f"  {k:>5} {m.aggregate_tokens_per_second:9.2f} {m.median_tokens_per_second:9.2f} "
                f"{cell.speedup(k):8.3f} {100 * s.acceptance_rate:6.1f}% {s.mean_accepted_length:8.2f} "
                f"{s.rollbacks:9d}  {cell.output_match(k)}"
            )
        best = cell.best_draft_tokens
        if best is None:
            lines.append("  best setting        : ordinary decoding (no draft length was faster)")
        else:
            lines.append(f"  best setting        : draft tokens {best} ({cell.speedup(best):.3f}x)")
        lines.append("")
    return "\n".join(lines).rstrip()
