"""Run ordinary and speculative decoding side by side and compare them fairly.

Both modes share one loaded target model (weights are read once), each with its own context.
Warm-up runs are excluded; measured runs alternate A B A B so machine drift hits both modes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional

from .._llama import Model, recent_log_messages
from ..config import SpecConfig, TargetConfig
from ..engine import LlamaDFlashDecoding, OrdinaryDecoding
from ..proposers.factory import draft_model_ceiling
from ..sampling import SamplingParams
from ..stats import SpecStats, merge_speculator_counts
from .backend import BackendInfo, backend_info
from .costmodel import CostModel, StepCosts, build_cost_model, cost_model_dict, phase_table, run_step_costs
from .oracle import oracle_proposals
from .probe import probe_step_costs

__all__ = ["BenchConfig", "RunResult", "ModeResult", "BenchResult", "run_benchmark", "first_divergence", "timed_run",
           "run_oracle", "oracle_length", "merge_speculators", "speculator_summary", "draft_length_settable",
           "oracle_supported", "NO_DRAFT_MODEL_NOTE"]

#: why the cost probe and the oracle are skipped for token-only drafters
NO_DRAFT_MODEL_NOTE = "no draft model ({types}): {what} skipped (it times or replays the draft model's block)"


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
    oracle: bool = False  # also run the oracle (ordinary tokens as proposals, real draft cost)
    probe: bool = True  # time verify/draft of every k in isolation for the cost model

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
    accepted: Optional[int] = None  # draft tokens accepted in this run (speculative only)
    drafted: Optional[int] = None
    decode_seconds: Optional[float] = None  # prefill excluded (what llama.cpp's drivers report)

    @property
    def decode_tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds else 0.0


@dataclass
class ModeResult:
    name: str
    load_seconds: float = 0.0
    runs: list[RunResult] = field(default_factory=list)
    stats: Optional[SpecStats] = None  # summed over measured runs
    # per-speculator raw counts summed over measured runs (chains, token drafters, auto): name ->
    # {"draft_calls", "drafts", "drafted", "accepted_drafts", "accepted", "accepted_per_position",
    # "draft_seconds"}; auto's "none": {"drafts": steps without a draft}.  Empty for a draft model alone
    speculators: dict[str, dict] = field(default_factory=dict)

    def add_run_stats(self, stats: SpecStats) -> None:
        """One measured run's statistics into the totals (`stats` and `speculators`)."""
        if self.stats is not None:
            self.stats.merge(stats)
        merge_speculators(self.speculators, stats)

    @property
    def aggregate_tokens_per_second(self) -> float:
        secs = sum(r.seconds for r in self.runs)
        return sum(r.tokens for r in self.runs) / secs if secs > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens per second of the decode loops, prefill excluded (the cost model's terms)."""
        secs = sum(r.decode_seconds or 0.0 for r in self.runs)
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
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "median_tokens_per_second": self.median_tokens_per_second,
            "runs_deterministic": self.deterministic,
        }
        if self.stats is not None:
            d["stats"] = self.stats.to_dict()
        if self.speculators:
            d["speculators"] = speculator_summary(self.speculators)
        return d


def merge_speculators(into: dict[str, dict], stats: Any) -> None:
    """Add one generation's `stats.speculators` (raw counts by name) to `into`."""
    merge_speculator_counts(into, getattr(stats, "speculators", None) or {})


def speculator_summary(raw: dict[str, dict]) -> dict[str, dict]:
    """Raw per-speculator counts with their rates: acceptance_rate (accepted / drafted),
    tokens_per_step (1 + accepted / drafts: tau over the steps it drafted; 0 without a draft) and
    acceptance_per_position (its drafts whose slot i was accepted, per draft)."""
    out: dict[str, dict] = {}
    for name, c in raw.items():
        if name == "none":  # auto's steps without a draft
            out[name] = {"drafts": int(c.get("drafts", 0))}
            continue
        drafts, drafted, accepted = c.get("drafts", 0), c.get("drafted", 0), c.get("accepted", 0)
        per = list(c.get("accepted_per_position", []))
        out[name] = {
            "draft_calls": c.get("draft_calls", 0), "drafts": drafts, "drafted": drafted,
            "accepted_drafts": c.get("accepted_drafts", 0), "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "tokens_per_step": 1.0 + accepted / drafts if drafts else 0.0,
            "accepted_per_position": per,
            "acceptance_per_position": [a / drafts for a in per] if drafts else [],
            "draft_seconds": c.get("draft_seconds", 0.0),
        }
    return out


def draft_length_settable(dec: LlamaDFlashDecoding) -> bool:
    """Whether `dec.set_draft_n_max` can change the draft length (a draft model, not under `auto`,
    which picks every step's draft itself)."""
    return dec.draft_info is not None and "auto" not in dec.spec.spec_types


def oracle_supported(dec: LlamaDFlashDecoding) -> bool:
    """The oracle replays tokens through the draft model's block at a fixed length."""
    return draft_length_settable(dec)


@dataclass
class BenchResult:
    config: BenchConfig
    prompt_tokens: int
    ordinary: ModeResult
    speculative: ModeResult
    algorithm: str
    draft_n_max: int
    warnings: list[str] = field(default_factory=list)
    oracle: Optional[ModeResult] = None
    oracle_draft_tokens: Optional[int] = None
    step_costs: Optional[StepCosts] = None
    backend: Optional[BackendInfo] = None
    # whether the engine chose the draft length adaptively (None: as the configuration says)
    adaptive: Optional[bool] = None
    speculator_names: tuple[str, ...] = ()  # the engine's drafters, in priority order
    has_draft_model: bool = True
    notes: list[str] = field(default_factory=list)  # what was skipped or changed, and why

    @property
    def is_adaptive(self) -> bool:
        return self.config.spec.adaptive if self.adaptive is None else self.adaptive

    def decode_speedups(self) -> tuple[dict[Any, float], dict[Any, float]]:
        """Decode-loop speedups (prefill excluded) of the measured setting and of the oracle."""
        base = self.ordinary.decode_tokens_per_second
        k = "auto" if self.is_adaptive else self.draft_n_max
        spec = {k: self.speculative.decode_tokens_per_second / base} if base else {}
        orc = ({self.oracle_draft_tokens: self.oracle.decode_tokens_per_second / base}
               if base and self.oracle is not None else {})
        return spec, orc

    @property
    def oracle_speedup(self) -> Optional[float]:
        base = self.ordinary.aggregate_tokens_per_second
        return self.oracle.aggregate_tokens_per_second / base if self.oracle is not None and base > 0 else None

    @property
    def measured_runs(self) -> dict[Any, SpecStats]:
        """Draft length ("auto" or k) -> speculative statistics, for the cost tables."""
        return {"auto" if self.is_adaptive else self.draft_n_max: self.speculative.stats}

    def phase_table(self) -> dict[str, Any]:
        runs = dict(self.measured_runs)
        if self.oracle is not None:
            runs[f"oracle {self.oracle_draft_tokens}"] = self.oracle.stats
        return phase_table(self.ordinary.stats, runs)

    def cost_model(self) -> CostModel:
        costs = self.step_costs or run_step_costs(self.measured_runs)
        return build_cost_model(self.ordinary.stats, self.measured_runs, costs)

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
                **({"spec_types": list(c.spec.spec_types), "speculators": list(self.speculator_names),
                    "ngram_size_n": c.spec.ngram_size_n, "ngram_size_m": c.spec.ngram_size_m,
                    "ngram_min_hits": c.spec.ngram_min_hits, "adaptive": self.is_adaptive}
                   if c.spec.spec_type is not None else {}),
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
                "oracle_speedup": self.oracle_speedup,
                "oracle_draft_tokens": self.oracle_draft_tokens,
            },
            "oracle": self.oracle.to_dict() if self.oracle is not None else None,
            "phases": self.phase_table(),
            "cost_model": cost_model_dict(self.cost_model(), *self.decode_speedups()),
            "step_costs": asdict(self.step_costs) if self.step_costs is not None else None,
            "backend": self.backend.to_dict() if self.backend is not None else None,
            "warnings": self.warnings,
            **({"notes": self.notes} if self.notes else {}),
        }


def first_divergence(a: list[int], b: list[int]) -> Optional[int]:
    """1-based index of the first generated token where a and b differ; None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i + 1
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


def timed_run(decoder: Any, prompt: list[int], cfg: Any, max_tokens: int) -> tuple[RunResult, SpecStats]:
    """One generation, timed; `cfg` has sampling and ignore_eos (a BenchConfig or SweepConfig)."""
    t0 = time.perf_counter()
    res = decoder.generate(prompt, max_tokens, cfg.sampling, ignore_eos=cfg.ignore_eos)
    secs = time.perf_counter() - t0
    n, s = len(res.tokens), res.stats
    spec = isinstance(decoder, LlamaDFlashDecoding)
    run = RunResult(n, secs, n / secs if secs > 0 else 0.0, res.tokens, res.finish_reason,
                    accepted=s.accepted if spec else None, drafted=s.drafted if spec else None,
                    decode_seconds=max(0.0, s.total_seconds - s.prefill_seconds))
    return run, s


#: n_ctx is raised to a multiple of this when a prompt and its generation do not fit
CTX_STEP = 256
#: context kept free past the longest generation: the last steps still draft and verify a block
CTX_MARGIN = 32


def raise_context(cfg: Any, longest: int, where: str, max_tokens: int) -> list[str]:
    """Where the longest prompt plus the largest max_tokens (plus a draft block) does not fit in
    `cfg.target.n_ctx` (generation would stop early there: a 2048-token run in the default 2048),
    raise it to a multiple of CTX_STEP that does; returns the note saying so (none if it fit)."""
    n_ctx = cfg.target.n_ctx
    need = longest + max_tokens + CTX_MARGIN
    if need <= n_ctx:
        return []
    new = -(-need // CTX_STEP) * CTX_STEP
    cfg.target = replace(cfg.target, n_ctx=new)
    return [f"n_ctx raised from {n_ctx} to {new}: the longest prompt ({where}) has {longest} tokens, "
            f"plus max-tokens {max_tokens} and {CTX_MARGIN} for the last draft block"]


def run_benchmark(cfg: BenchConfig, progress: Optional[Callable[[str], None]] = None) -> BenchResult:
    """Load once, warm up both modes, then alternate measured runs."""
    import warnings as _warnings

    note = progress or (lambda _msg: None)
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        t0 = time.perf_counter()
        model = Model(cfg.target.model, n_gpu_layers=cfg.target.n_gpu_layers, repack=cfg.target.repack,
                      load_mtp=cfg.spec.uses_mtp)
        model_load = time.perf_counter() - t0
        try:
            fit = raise_context(cfg, len(model.tokenize(cfg.prompt)), "the prompt", cfg.max_tokens)
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
    result.notes[:0] = fit
    result.backend = backend_info()
    result.warnings = [str(w.message) for w in caught] + [f"llama.cpp {lvl}: {m}" for lvl, m in recent_log_messages()]
    return result


def oracle_length(spec_dec: LlamaDFlashDecoding, stats: SpecStats) -> int:
    """The fixed draft length the oracle runs at: the engine's, or under "auto" the length the
    controller chose most (the oracle must not teach the shared controller a perfect draft)."""
    if spec_dec.controller is None:
        return spec_dec.draft_n_max
    chosen = {int(k): v for k, v in stats.chosen_draft_tokens.items() if int(k) > 0}
    return max(chosen, key=lambda k: (chosen[k], k)) if chosen else spec_dec.draft_n_max


def run_oracle(spec_dec: LlamaDFlashDecoding, k: int, prompt: list[int], reference: list[int], cfg: Any,
               max_tokens: int) -> tuple[RunResult, SpecStats]:
    """One oracle generation at draft length k; the engine's draft length is restored after."""
    before = "auto" if spec_dec.controller is not None else spec_dec.draft_n_max
    spec_dec.set_draft_n_max(k)
    try:
        with oracle_proposals(spec_dec, len(prompt), reference):
            return timed_run(spec_dec, prompt, cfg, max_tokens)
    finally:
        spec_dec.set_draft_n_max(before)


def skipped_notes(spec_dec: LlamaDFlashDecoding, oracle: bool, probe: bool) -> list[str]:
    """Notes on what these drafters cannot run: the cost probe and the oracle need a draft model
    (the oracle also a fixed draft length, which `auto` does not have)."""
    types = ",".join(spec_dec.speculator_names)
    notes = []
    if probe and spec_dec.draft_info is None:
        notes.append(NO_DRAFT_MODEL_NOTE.format(types=types, what="cost probe"))
    if oracle and not oracle_supported(spec_dec):
        notes.append(NO_DRAFT_MODEL_NOTE.format(types=types, what="oracle") if spec_dec.draft_info is None else
                     f"oracle skipped: {types} picks every step's draft itself (the oracle replays tokens "
                     "at one fixed draft length)")
    return notes


def _measure(cfg: BenchConfig, ord_dec: OrdinaryDecoding, spec_dec: LlamaDFlashDecoding,
             ord_load: float, spec_load: float, note: Callable[[str], None]) -> BenchResult:
    prompt = ord_dec.tokenize(cfg.prompt)
    ordinary = ModeResult("ordinary", load_seconds=ord_load, stats=SpecStats(algorithm="ordinary"))
    speculative = ModeResult(spec_dec.algorithm, load_seconds=spec_load, stats=SpecStats(
        algorithm=spec_dec.algorithm, draft_n_max=spec_dec.draft_n_max,
        backend_sampling_requested=cfg.spec.backend_sampling is not False,
    ))
    oracle: Optional[ModeResult] = None
    oracle_k: Optional[int] = None
    notes = skipped_notes(spec_dec, cfg.oracle, cfg.probe)
    with_oracle = oracle_supported(spec_dec)
    if cfg.warmup_tokens:
        note("warm-up")
        timed_run(ord_dec, prompt, cfg, cfg.warmup_tokens)
        timed_run(spec_dec, prompt, cfg, cfg.warmup_tokens)
    for i in range(cfg.runs):
        note(f"run {i + 1}/{cfg.runs}: ordinary")
        run, stats = timed_run(ord_dec, prompt, cfg, cfg.max_tokens)
        ordinary.runs.append(run)
        ordinary.add_run_stats(stats)
        note(f"run {i + 1}/{cfg.runs}: {spec_dec.algorithm}")
        run, stats = timed_run(spec_dec, prompt, cfg, cfg.max_tokens)
        speculative.runs.append(run)
        speculative.add_run_stats(stats)
        speculative.stats.backend_sampling_active |= stats.backend_sampling_active
        if cfg.oracle and with_oracle:
            if oracle is None:
                oracle_k = oracle_length(spec_dec, speculative.stats)
                oracle = ModeResult("oracle", stats=SpecStats(algorithm=spec_dec.algorithm, draft_n_max=oracle_k))
            note(f"run {i + 1}/{cfg.runs}: oracle")
            run, stats = run_oracle(spec_dec, oracle_k, prompt, ordinary.runs[-1].output_tokens, cfg, cfg.max_tokens)
            oracle.runs.append(run)
            oracle.add_run_stats(stats)
    costs = None
    if cfg.probe and spec_dec.draft_info is not None:
        note("cost probe")
        costs = probe_step_costs(spec_dec, prompt, range(1, draft_model_ceiling(spec_dec.draft_info) + 1),
                                 ordinary=ord_dec)
    return BenchResult(cfg, len(prompt), ordinary, speculative, spec_dec.algorithm, spec_dec.draft_n_max,
                       oracle=oracle, oracle_draft_tokens=oracle_k, step_costs=costs,
                       adaptive=spec_dec.controller is not None, speculator_names=spec_dec.speculator_names,
                       has_draft_model=spec_dec.draft_info is not None, notes=notes)
