"""Run ordinary and speculative decoding side by side and compare them fairly.

Both modes share one loaded target model (weights are read once), each with its own context.
Warm-up runs are excluded; measured runs alternate A B A B so machine drift hits both modes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from .._llama import Model, recent_log_messages
from ..config import SpecConfig, TargetConfig
from ..engine import LlamaDFlashDecoding, OrdinaryDecoding
from ..sampling import SamplingParams
from ..stats import SpecStats

__all__ = ["BenchConfig", "RunResult", "ModeResult", "BenchResult", "run_benchmark", "first_divergence"]


@dataclass
class BenchConfig:
    target: TargetConfig
    spec: SpecConfig
    prompt: str
    max_tokens: int = 256
    warmup_tokens: int = 32
    runs: int = 3
    ignore_eos: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("the prompt must not be empty")
        for name in ("max_tokens", "runs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, not {getattr(self, name)}")
        if self.warmup_tokens < 0:
            raise ValueError(f"warmup-tokens must be >= 0, not {self.warmup_tokens}")


@dataclass
class RunResult:
    tokens: int
    seconds: float
    tokens_per_second: float
    output_tokens: list[int]
    finish_reason: Optional[str]


@dataclass
class ModeResult:
    name: str
    load_seconds: float = 0.0
    runs: list[RunResult] = field(default_factory=list)
    stats: Optional[SpecStats] = None  # summed over measured runs (speculative only)

    @property
    def aggregate_tokens_per_second(self) -> float:
        secs = sum(r.seconds for r in self.runs)
        return sum(r.tokens for r in self.runs) / secs if secs > 0 else 0.0

    @property
    def median_tokens_per_second(self) -> float:
        return statistics.median(r.tokens_per_second for r in self.runs) if self.runs else 0.0

    @property
    def deterministic(self) -> bool:
        return all(r.output_tokens == self.runs[0].output_tokens for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "load_seconds": self.load_seconds,
            "runs": [asdict(r) for r in self.runs],
            "aggregate_tokens_per_second": self.aggregate_tokens_per_second,
            "median_tokens_per_second": self.median_tokens_per_second,
            "runs_deterministic": self.deterministic,
        }
        if self.stats is not None:
            d["stats"] = self.stats.to_dict()
        return d


@dataclass
class BenchResult:
    config: BenchConfig
    prompt_tokens: int
    ordinary: ModeResult
    speculative: ModeResult
    algorithm: str
    draft_n_max: int
    warnings: list[str] = field(default_factory=list)

    @property
    def output_tokens_match(self) -> bool:
        return self.ordinary.runs[0].output_tokens == self.speculative.runs[0].output_tokens

    @property
    def runs_deterministic(self) -> bool:
        return self.ordinary.deterministic and self.speculative.deterministic

    @property
    def first_divergence(self) -> Optional[int]:
        return first_divergence(self.ordinary.runs[0].output_tokens, self.speculative.runs[0].output_tokens)

    @property
    def speedup(self) -> float:
        base = self.ordinary.aggregate_tokens_per_second
        return self.speculative.aggregate_tokens_per_second / base if base > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "settings": {
                "model": c.target.model,
                "draft_model": c.spec.draft_model,
                "algorithm": self.algorithm,
                "prompt": c.prompt,
                "prompt_tokens": self.prompt_tokens,
                "max_tokens": c.max_tokens,
                "warmup_tokens": c.warmup_tokens,
                "runs": c.runs,
                "ignore_eos": c.ignore_eos,
                "n_ctx": c.target.n_ctx,
                "n_batch": c.target.n_batch,
                "n_ubatch": c.target.n_ubatch,
                "draft_n_max": self.draft_n_max,
                "draft_n_min": c.spec.draft_n_min,
                "draft_p_min": c.spec.draft_p_min,
                "backend_sampling": c.spec.backend_sampling,
                "temperature": c.sampling.temperature,
                "seed": c.sampling.seed,
            },
            "ordinary": self.ordinary.to_dict(),
            "speculative": self.speculative.to_dict(),
            "comparison": {
                "output_tokens_match": self.output_tokens_match,
                "runs_deterministic": self.runs_deterministic,
                "first_divergence": self.first_divergence,
                "speedup": self.speedup,
            },
            "warnings": self.warnings,
        }


def first_divergence(a: list[int], b: list[int]) -> Optional[int]:
    """1-based index of the first generated token where a and b differ; None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i + 1
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


def _timed_run(decoder: Any, prompt: list[int], cfg: BenchConfig, max_tokens: int) -> tuple[RunResult, SpecStats]:
    t0 = time.perf_counter()
    res = decoder.generate(prompt, max_tokens, cfg.sampling, ignore_eos=cfg.ignore_eos)
    secs = time.perf_counter() - t0
    n = len(res.tokens)
    return RunResult(n, secs, n / secs if secs > 0 else 0.0, res.tokens, res.finish_reason), res.stats


def run_benchmark(cfg: BenchConfig, progress: Optional[Callable[[str], None]] = None) -> BenchResult:
    """Load once, warm up both modes, then alternate measured runs."""
    import warnings as _warnings

    note = progress or (lambda _msg: None)
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        t0 = time.perf_counter()
        model = Model(cfg.target.model, n_gpu_layers=cfg.target.n_gpu_layers, repack=cfg.target.repack)
        model_load = time.perf_counter() - t0
        try:
            t1 = time.perf_counter()
            spec_dec = LlamaDFlashDecoding(cfg.target, cfg.spec, model=model)
            spec_load = model_load + time.perf_counter() - t1
            try:
                t2 = time.perf_counter()
                ord_dec = OrdinaryDecoding(cfg.target, model=model)
                ord_load = model_load + time.perf_counter() - t2
                try:
                    result = _measure(cfg, ord_dec, spec_dec, ord_load, spec_load, note)
                finally:
                    ord_dec.close()
            finally:
                spec_dec.close()
        finally:
            model.close()
    result.warnings = [str(w.message) for w in caught] + [f"llama.cpp {lvl}: {m}" for lvl, m in recent_log_messages()]
    return result


def _measure(cfg: BenchConfig, ord_dec: OrdinaryDecoding, spec_dec: LlamaDFlashDecoding,
             ord_load: float, spec_load: float, note: Callable[[str], None]) -> BenchResult:
    prompt = ord_dec.tokenize(cfg.prompt)
    ordinary = ModeResult("ordinary", load_seconds=ord_load)
    speculative = ModeResult(spec_dec.algorithm, load_seconds=spec_load, stats=SpecStats(
        algorithm=spec_dec.algorithm, draft_n_max=spec_dec.draft_n_max,
        backend_sampling_requested=cfg.spec.backend_sampling,
    ))
    if cfg.warmup_tokens:
        note("warm-up")
        _timed_run(ord_dec, prompt, cfg, cfg.warmup_tokens)
        _timed_run(spec_dec, prompt, cfg, cfg.warmup_tokens)
    for i in range(cfg.runs):
        note(f"run {i + 1}/{cfg.runs}: ordinary")
        run, _ = _timed_run(ord_dec, prompt, cfg, cfg.max_tokens)
        ordinary.runs.append(run)
        note(f"run {i + 1}/{cfg.runs}: {spec_dec.algorithm}")
        run, stats = _timed_run(spec_dec, prompt, cfg, cfg.max_tokens)
        speculative.runs.append(run)
        speculative.stats.merge(stats)
        speculative.stats.backend_sampling_active |= stats.backend_sampling_active
    return BenchResult(cfg, len(prompt), ordinary, speculative, spec_dec.algorithm, spec_dec.draft_n_max)
