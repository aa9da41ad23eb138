"""`llama-dflash bench --compare-speculators`: which speculator for this model, on this machine?

Every speculator that applies to the target -- its own MTP head, each draft file given (DFlash,
DSpark, an EAGLE-3 head, a classic draft model as draft-simple) alone and chained behind
ngram-simple, our lookup, llama.cpp's n-gram types, `auto` over all of them -- runs on the same
prompts, one after another per prompt (machine drift hits them alike), against ordinary decoding.
For each: tau (tokens per verification step), decode tokens/s and the speedup (prompt processing
excluded on both sides), whether the output equals ordinary decoding, and the cost model's
verdict: a step of the speculator costs `cost` ordinary decodes (its draft plus the target's
verification of k+1 rows) and yields tau tokens, so it pays where tau > cost.  What does not apply is listed
with the reason (a target without an MTP head, a draft for another target, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .._llama import Model
from ..config import SpecConfig, TargetConfig
from ..engine import LlamaDFlashDecoding, OrdinaryDecoding
from ..errors import DFlashError
from ..draft_models import guess_algorithm, resolve_draft
from ..inspect import check_gguf_file
from ..proposers.mtp import check_mtp_target
from ..sampling import SamplingParams
from ..stats import SpecStats

__all__ = ["Candidate", "SpeculatorResult", "Comparison", "applicable_speculators", "compare_speculators",
           "format_comparison", "NGRAM_CANDIDATES"]

#: the token-only types compared (llama.cpp's n-gram types with their default sizes, our lookup)
NGRAM_CANDIDATES = ("lookup", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
#: a speculator "pays" where it beats ordinary decoding by more than this (noise)
PAYS = 1.02


@dataclass
class Candidate:
    """One speculator to measure: its display name and SpecConfig."""

    name: str
    spec: SpecConfig


@dataclass
class SpeculatorResult:
    name: str
    tokens: int = 0
    decode_seconds: float = 0.0
    stats: SpecStats = field(default_factory=SpecStats)
    mismatches: int = 0  # generations whose tokens differ from ordinary decoding's
    generations: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass
class Comparison:
    target: str
    prompts: int
    runs: int
    max_tokens: int
    ordinary: SpeculatorResult
    results: list[SpeculatorResult]
    not_applicable: list[tuple[str, str]]
    #: per workload (prompt label): ordinary decoding's result and each speculator's, by name
    by_workload: dict[str, tuple[SpeculatorResult, dict[str, SpeculatorResult]]] = field(default_factory=dict)

    def speedup(self, r: SpeculatorResult, ordinary: Optional[SpeculatorResult] = None) -> float:
        base = (ordinary or self.ordinary).tokens_per_second
        return r.tokens_per_second / base if base > 0 else 0.0

    def step_cost(self, r: SpeculatorResult, ordinary: Optional[SpeculatorResult] = None) -> float:
        """A verification step of `r` (draft + verify + the rest), in ordinary decodes."""
        base = ordinary or self.ordinary
        steps = r.stats.verification_steps
        per_token = base.decode_seconds / base.tokens if base.tokens else 0.0
        return (r.decode_seconds / steps) / per_token if steps and per_token > 0 else 0.0

    def verdict(self, r: SpeculatorResult, ordinary: Optional[SpeculatorResult] = None) -> str:
        """Why `r` wins or loses against ordinary decoding (`ordinary`: one workload's, else all)."""
        tau, cost, s = r.stats.tau, self.step_cost(r, ordinary), self.speedup(r, ordinary)
        if r.stats.drafted == 0:
            return "never drafted here (no match, or its cost model chose no draft at every step)"
        # tau / cost is the speedup itself: a step yields tau tokens for the price of cost decodes
        why = f"tau {tau:.2f} {'>' if tau > cost else '<='} a step's cost of {cost:.2f} ordinary decodes"
        if s >= PAYS:
            return f"pays: {why}"
        if tau > cost:
            return f"even: {why}, within {100 * (PAYS - 1):.0f}% of ordinary decoding (noise)"
        if r.stats.acceptance_rate < 0.2:
            return f"loses: {why}; {100 * r.stats.acceptance_rate:.0f}% of its drafts accepted"
        return f"loses: {why}; verifying its drafts costs more than they save on this machine"

    @property
    def winner(self) -> Optional[SpeculatorResult]:
        return self._best(self.results)

    def _best(self, results: Sequence[SpeculatorResult],
              ordinary: Optional[SpeculatorResult] = None) -> Optional[SpeculatorResult]:
        # one that never drafted ran ordinary decoding: its "speedup" is noise, never a win
        best = max((r for r in results if r.stats.drafted), key=lambda r: self.speedup(r, ordinary), default=None)
        return best if best is not None and self.speedup(best, ordinary) >= PAYS else None

    def workload_winners(self) -> dict[str, Optional[SpeculatorResult]]:
        """Per workload, the speculator that beats ordinary decoding most (None: none pays there)."""
        return {label: self._best(list(rs.values()), base) for label, (base, rs) in self.by_workload.items()}

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for r in self.results:
            rows.append({"name": r.name, "tau": r.stats.tau, "acceptance_rate": r.stats.acceptance_rate,
                         "drafted": r.stats.drafted, "accepted": r.stats.accepted,
                         "tokens_per_second": r.tokens_per_second, "speedup": self.speedup(r),
                         "step_cost_ordinary_decodes": self.step_cost(r), "output_matches": r.mismatches == 0,
                         "verdict": self.verdict(r)})
        w = self.winner
        by_workload = {label: {name: {"tau": r.stats.tau, "speedup": self.speedup(r, base),
                                      "acceptance_rate": r.stats.acceptance_rate, "output_matches": r.mismatches == 0,
                                      "step_cost_ordinary_decodes": self.step_cost(r, base),
                                      "verdict": self.verdict(r, base)}
                               for name, r in results.items()}
                       for label, (base, results) in self.by_workload.items()}
        winners = {label: (b.name if b is not None else None) for label, b in self.workload_winners().items()}
        return {"target": self.target, "prompts": self.prompts, "runs": self.runs, "max_tokens": self.max_tokens,
                "ordinary_tokens_per_second": self.ordinary.tokens_per_second, "speculators": rows,
                "winner": w.name if w is not None else None, "by_workload": by_workload,
                "winner_by_workload": winners,
                "not_applicable": [{"name": n, "reason": why} for n, why in self.not_applicable]}


def applicable_speculators(target: str, drafts: Sequence[str] = (), *, draft_tokens: "int | str" = "auto",
                           ngram_types: Sequence[str] = NGRAM_CANDIDATES) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The speculators that apply to `target` (with `drafts`), and those that do not, with why.

    Nothing is loaded: the checks read the GGUF headers (those the engine makes when it starts)."""
    info = check_gguf_file(target)
    cands: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    mtp = False
    try:
        check_mtp_target(info)
        mtp = True
        cands.append(Candidate("draft-mtp", SpecConfig(spec_type="draft-mtp", draft_n_max=draft_tokens)))
    except DFlashError as e:
        skipped.append(("draft-mtp", getattr(e, "expected", str(e))))
    first_draft: Optional[tuple[str, str]] = None  # (path, type)
    for path in drafts:
        label = os.path.basename(path)
        try:
            d = resolve_draft(info, path, guess_algorithm(path))
        except DFlashError as e:
            skipped.append((label, str(e)))
            continue
        cands.append(Candidate(f"{d.kind} ({label})", SpecConfig(path, spec_type=d.kind, draft_n_max=draft_tokens)))
        chain = f"ngram-simple,{d.kind}"  # llama.cpp's own chain: the n-gram first, the model where it has no match
        cands.append(Candidate(f"{chain} ({label})", SpecConfig(path, spec_type=chain, draft_n_max=draft_tokens)))
        first_draft = first_draft or (path, d.kind)
    for name in ngram_types:
        cands.append(Candidate(name, SpecConfig(spec_type=name)))
    auto_types = "auto" + (",draft-mtp" if mtp else "") + (f",{first_draft[1]}" if first_draft else "")
    cands.append(Candidate(auto_types, SpecConfig(first_draft[0] if first_draft else None, spec_type=auto_types)))
    return cands, skipped



def _timed(dec: Any, prompt: list[int], max_tokens: int, sampling: SamplingParams, ignore_eos: bool):
    res = dec.generate(prompt, max_tokens, sampling, ignore_eos=ignore_eos)
    s = res.stats
    return res.tokens, max(0.0, s.total_seconds - s.prefill_seconds), s


def compare_speculators(target: TargetConfig, candidates: Sequence[Candidate], prompts: Sequence[str], *,
                        max_tokens: int, runs: int = 1, ignore_eos: bool = False,
                        sampling: Optional[SamplingParams] = None, warmup_tokens: int = 16,
                        not_applicable: Sequence[tuple[str, str]] = (),
                        progress: Optional[Callable[[str], None]] = None,
                        labels: Optional[Sequence[str]] = None) -> Comparison:
    """Load the target once; per run and prompt, ordinary decoding then every candidate.
    `labels`: each prompt's workload, for a per-workload breakdown (`Comparison.by_workload`)."""
    if labels is not None and len(labels) != len(prompts):
        raise ValueError("give one workload label per prompt")
    sampling = sampling or SamplingParams()
    note = progress or (lambda _msg: None)
    model = Model(target.model, n_gpu_layers=target.n_gpu_layers, repack=target.repack,
                  load_mtp=any(c.spec.uses_mtp for c in candidates))
    engines: dict[str, LlamaDFlashDecoding] = {}
    try:
        ordinary_dec = OrdinaryDecoding(target, model=model)
        for c in candidates:
            engines[c.name] = LlamaDFlashDecoding(target, c.spec, model=model)
        toks = [ordinary_dec.tokenize(p) for p in prompts]
        if warmup_tokens:
            ordinary_dec.generate(toks[0], warmup_tokens, sampling, ignore_eos=ignore_eos)
            for dec in engines.values():
                dec.generate(toks[0], warmup_tokens, sampling, ignore_eos=ignore_eos)
        ordinary = SpeculatorResult("ordinary")
        results = {c.name: SpeculatorResult(c.name) for c in candidates}
        per: dict[str, tuple[SpeculatorResult, dict[str, SpeculatorResult]]] = {}
        for _ in range(runs):
            for i, prompt in enumerate(toks):
                label = labels[i] if labels is not None else ""
                if labels is not None and label not in per:
                    per[label] = (SpeculatorResult("ordinary"), {c.name: SpeculatorResult(c.name) for c in candidates})
                ref, secs, _s = _timed(ordinary_dec, prompt, max_tokens, sampling, ignore_eos)
                for o in (ordinary, *([per[label][0]] if labels is not None else [])):
                    o.tokens += len(ref)
                    o.decode_seconds += secs
                    o.generations += 1
                for name, dec in engines.items():
                    out, secs, stats = _timed(dec, prompt, max_tokens, sampling, ignore_eos)
                    for r in (results[name], *([per[label][1][name]] if labels is not None else [])):
                        r.tokens += len(out)
                        r.decode_seconds += secs
                        r.generations += 1
                        r.mismatches += int(out != ref)
                        r.stats.merge(stats)
                note("prompt done")
        return Comparison(target.model, len(prompts), runs, max_tokens, ordinary, list(results.values()),
                          list(not_applicable), per)
    finally:
        for dec in engines.values():
            dec.close()
        if "ordinary_dec" in locals():
            ordinary_dec.close()
        model.close()


def format_comparison(c: Comparison) -> str:
    lines = [f"[speculators: {os.path.basename(c.target)}, {c.prompts} prompt(s) x {c.runs} run(s), "
             f"up to {c.max_tokens} tokens; decode loops, prefill excluded]"]
    width = max([len("speculator")] + [len(r.name) for r in c.results]) + 2
    lines.append(f"  {'speculator':<{width}}{'tau':>6}{'accept':>9}{'tok/s':>10}{'speedup':>9}  {'output':<9}verdict")
    lines.append(f"  {'ordinary':<{width}}{1.0:>6.2f}{'-':>9}{c.ordinary.tokens_per_second:>10.1f}{1.0:>8.2f}x  "
                 f"{'-':<9}-")
    for r in sorted(c.results, key=c.speedup, reverse=True):
        acc = f"{100 * r.stats.acceptance_rate:.1f}%" if r.stats.drafted else "-"
        out = "same" if r.mismatches == 0 else f"{r.mismatches} differ"
        lines.append(f"  {r.name:<{width}}{r.stats.tau:>6.2f}{acc:>9}{r.tokens_per_second:>10.1f}"
                     f"{c.speedup(r):>8.2f}x  {out:<9}{c.verdict(r)}")
    w = c.winner
    lines.append("  winner: " + (f"{w.name} ({c.speedup(w):.2f}x ordinary decoding)" if w is not None else
                                 "none: no speculator beats ordinary decoding here"))
    if len(c.by_workload) > 1:
        labels = list(c.by_workload)
        cw = max(14, *(len(label) + 2 for label in labels))
        lines.append("  by workload (tau / speedup):")
        lines.append(f"    {'speculator':<{width}}" + "".join(f"{label:>{cw}}" for label in labels))
        for r in sorted(c.results, key=c.speedup, reverse=True):
            cells = []
            for label in labels:
                base, rs = c.by_workload[label]
                w_r = rs[r.name]
                cells.append(f"{w_r.stats.tau:.2f} / {c.speedup(w_r, base):.2f}x")
            lines.append(f"    {r.name:<{width}}" + "".join(f"{cell:>{cw}}" for cell in cells))
        for label, b in c.workload_winners().items():
            base = c.by_workload[label][0]
            lines.append(f"    winner on {label}: " + (
                f"{b.name} ({c.speedup(b, base):.2f}x; {c.verdict(b, base)})" if b is not None else
                "none: no speculator beats ordinary decoding there"))
    if c.not_applicable:
        lines.append("  not applicable:")
        lines += [f"    {name}: {why}" for name, why in c.not_applicable]
    return "\n".join(lines)
