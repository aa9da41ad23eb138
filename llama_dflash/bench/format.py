"""Human-readable summary of a benchmark, in the layout testers already paste into reports."""

from __future__ import annotations

import os

from typing import Any, Optional

from .costmodel import PHASES, CostModel, speedup_line
from .runner import BenchResult, ModeResult, speculator_summary

__all__ = ["format_header", "format_result", "format_phases", "format_cost_model", "format_tau", "speedup_line",
           "format_speculators", "speculator_rows"]


def format_header(res: BenchResult) -> str:
    c = res.config
    typed = c.spec.spec_type is not None
    draft = os.path.basename(c.spec.draft_model) if c.spec.draft_model else "none (token drafters only)"
    longest = "" if res.has_draft_model or not typed else " (the drafters' longest draft)"
    lines = [
        f"Target model   : {os.path.basename(c.target.model)}",
        f"Draft model    : {draft}",
        f"Algorithm      : {res.algorithm}",
        *([f"Spec types     : {','.join(res.speculator_names or c.spec.spec_types)}"] if typed else []),
        *(["N-gram sizes   : " + ", ".join(f"{k}={getattr(c.spec, k)}" for k in
                                            ("ngram_size_n", "ngram_size_m", "ngram_min_hits")
                                            if getattr(c.spec, k) is not None)]
          if typed and any(getattr(c.spec, k) is not None for k in ("ngram_size_n", "ngram_size_m", "ngram_min_hits"))
          else []),
        f"Prompt         : {c.prompt!r}",
        f"Measured runs  : {c.runs} x {c.max_tokens} tokens per mode",
        f"Warmup         : {c.warmup_tokens} tokens per mode",
        f"Draft settings : max={'auto (adaptive, up to ' + str(res.draft_n_max) + ')' if res.is_adaptive else res.draft_n_max}"
        f"{longest}"
        f", min={c.spec.draft_n_min}, p_min={c.spec.draft_p_min:g}",
        f"Backend sample : {'enabled' if c.spec.backend_sampling else 'disabled'}",
        f"Ignore EOG     : {c.ignore_eos}",
        f"Backend        : {res.backend.summary() if res.backend is not None else 'unknown'}",
        "Limitations    : text-only, seq_id=0",
        *(f"Note           : {n}" for n in res.notes),
    ]
    return "\n".join(lines)


def _mode_block(m: ModeResult, title: str) -> list[str]:
    out = [f"[{title}]", f"  model load          : {m.load_seconds:.3f} s (not benchmarked)"]
    for i, r in enumerate(m.runs, 1):
        out.append(f"  run {i:<15}: {r.tokens:4d} tokens / {r.seconds:.3f} s = {r.tokens_per_second:.2f} token/s")
    out.append(f"  aggregate           : {m.aggregate_tokens_per_second:.2f} token/s")
    out.append(f"  median run          : {m.median_tokens_per_second:.2f} token/s")
    return out


def format_result(res: BenchResult) -> str:
    lines = [format_header(res), ""]
    lines += _mode_block(res.ordinary, "ordinary")
    lines.append("")
    lines += _mode_block(res.speculative, res.algorithm)
    s = res.speculative.stats
    if s is not None:
        per_pos = ", ".join(f"{p:.2f}" for p in s.acceptance_per_position) or "-"
        steps = max(1, s.verification_steps)
        lines += [
            f"  draft proposed      : {s.drafted}",
            f"  draft verified      : {s.verified} in {s.verification_steps} steps",
            f"  draft accepted      : {s.accepted} ({100 * s.acceptance_rate:.1f}%)",
            f"  accepted per slot   : {per_pos}",
            *format_tau(s.tokens_per_step, s.accepted_per_step),
            f"  draft rollbacks     : {s.rollbacks} (native: {s.native_rollbacks})",
            f"  rollback mode       : {s.rollback_mode}"
            + (f" ({1000 * s.native_rollback_seconds:.2f} ms in native rollbacks)" if s.native_rollbacks else ""),
            f"  target decode+sync  : {s.target_seconds:.3f} s",
            f"  draft phase         : {s.draft_seconds:.3f} s",
            f"  process phase       : {s.process_seconds:.3f} s",
            f"  loop overhead       : {1000 * s.overhead_seconds / steps:.3f} ms/step",
        ]
        per = 1000 * s.checkpoint_seconds / max(1, s.verification_steps)
        lines.append(f"  checkpoint          : {1000 * s.checkpoint_seconds:.3f} ms ({per:.3f} ms/step)")
        if s.checkpoint_captures:
            lines += [
                f"  checkpoint captures : {s.checkpoint_captures} ({1000 * s.checkpoint_capture_seconds:.1f} ms, "
                f"{s.checkpoint_bytes} bytes, {'on device' if s.checkpoint_on_device else 'host'})",
                f"  checkpoint restores : {s.checkpoint_restores} ({1000 * s.checkpoint_restore_seconds:.1f} ms) "
                f"+ replay of {s.replayed_tokens} tokens ({1000 * s.replay_seconds:.1f} ms)",
            ]
        if res.speculative.speculators:
            lines += format_speculators(res.speculative.speculators)
        if s.adaptive:
            hist = ", ".join(f"{k}:{v}" for k, v in sorted(s.chosen_draft_tokens.items(), key=lambda kv: int(kv[0])))
            curve = ", ".join(f"{k}:{1000 * v:.1f}" for k, v in sorted(s.cost_curve.items(), key=lambda kv: int(kv[0])))
            lines += [
                f"  chosen draft tokens : {hist}",
                f"  ordinary steps      : {s.ordinary_steps} of {s.verification_steps}",
                f"  cost curve (ms/step): {curve}",
            ]
    lines.append("")
    div = res.first_divergence
    change = (res.speedup - 1.0) * 100
    lines += [
        f"[comparison: {res.algorithm} vs ordinary]",
        f"  output tokens match : {res.output_tokens_match}",
        f"  runs deterministic  : {res.runs_deterministic}",
        f"  first divergence    : {'none' if div is None else f'generated token {div}'}",
        f"  speedup             : {res.speedup:.3f}x",
        f"  throughput change   : {change:+.1f}%",
    ]
    if res.oracle is not None:
        o = res.oracle.stats
        lines.append(f"  oracle ceiling      : {res.oracle_speedup:.3f}x at draft tokens {res.oracle_draft_tokens} "
                     f"(measured: ordinary tokens as proposals, real draft cost; {100 * o.acceptance_rate:.1f}% accepted)")
    lines += ["", *format_phases(res.phase_table())]
    lines += ["", *format_cost_model(res.cost_model(), *res.decode_speedups())]
    return "\n".join(lines)


def speculator_rows(speculators: dict[str, dict]) -> list[dict[str, Any]]:
    """Per-speculator counts with their rates (`runner.speculator_summary`), each with its name."""
    return [{"name": name, **row} for name, row in speculator_summary(speculators).items()]


def format_speculators(speculators: dict[str, dict], title: Optional[str] = None) -> list[str]:
    """One row per speculator: drafts (steps it drafted), tokens drafted and accepted, acceptance
    rate, tokens per step (1 + accepted / drafts) and per-position acceptance (per draft)."""
    out = [f"  per speculator{f' ({title})' if title else ''}:",
           f"    {'name':<14}{'calls':>7}{'drafts':>8}{'drafted':>9}{'accepted':>9}{'accept':>8}{'tau':>6}"
           "  per position"]
    for r in speculator_rows(speculators):
        if r["name"] == "none":
            out.append(f"    {'none':<14}{'-':>7}{r['drafts']:>8}{'-':>9}{'-':>9}{'-':>8}{'-':>6}"
                       "  (auto: steps without a draft)")
            continue
        per = ", ".join(f"{p:.2f}" for p in r["acceptance_per_position"]) or "-"
        tau = f"{r['tokens_per_step']:.2f}" if r["drafts"] else "-"
        out.append(f"    {r['name']:<14}{r['draft_calls']:>7}{r['drafts']:>8}{r['drafted']:>9}{r['accepted']:>9}"
                   f"{100 * r['acceptance_rate']:>7.1f}%{tau:>6}  {per}")
    return out


def format_tau(tokens_per_step: float, accepted_per_step: float) -> list[str]:
    """tau as the DFlash/DSpark papers report it, and the accepted drafts per step beside it."""
    return [
        f"  tokens per step (tau): {tokens_per_step:.2f}  (accepted drafts + the target's token, per verification)",
        f"  accepted per step   : {accepted_per_step:.2f}  (draft tokens only)",
    ]


def format_phases(table: dict[str, Any]) -> list[str]:
    """The per-phase cost table: one row per draft length, phases per step in ordinary decodes."""
    unit = table["unit_seconds"]
    head = "".join(f"{p:>9}" for p in (*PHASES, "total")) + f"{'tok/step':>9}"
    out = [f"[per-step cost by phase, in ordinary decodes (1 = {1000 * unit:.2f} ms target decode+sync)]",
           f"  {'k':>9}{head}"]
    # (a draft length named for what it is: "auto" is the adaptive length, not --spec-type auto)
    rows = [("ord.", table["ordinary"]),
            *(("adaptive" if k == "auto" else "oracle adapt." if k == "oracle auto" else k, v)
              for k, v in table["draft_tokens"].items())]
    for label, row in rows:
        cells = "".join(f"{'-':>9}" if label == "ord." and p in ("draft", "inject", "rollback") else f"{row[p]:9.2f}"
                        for p in (*PHASES, "total"))
        out.append(f"  {label:>9}{cells}{row['tokens_per_step']:9.2f}")
    return out


def format_cost_model(model: CostModel, measured: dict[Any, float], oracle: Optional[dict[Any, float]] = None) -> list[str]:
    """Predicted speedup of every draft length from measured costs and acceptance, beside what was measured."""
    src = "timed in isolation" if model.costs_source == "probe" else "from the measured runs"
    out = [f"[cost model: speedup = tau(k) x ordinary token cost / step cost; draft and verify costs {src}; "
           "measured and oracle: decode loops, prefill excluded]",
           f"  {'k':>5} {'tau(k)':>7} {'step':>6} {'predicted':>9} {'measured':>9} {'ceiling':>8} {'oracle':>7}"]
    for p in model.predictions:
        meas = measured.get(p.k)
        orc = (oracle or {}).get(p.k)
        out.append(f"  {p.k:>5} {p.tokens_per_step:7.2f} {p.step_cost:6.2f} {p.speedup:8.2f}x "
                   f"{f'{meas:.2f}x' if meas is not None else '-':>9} {p.ceiling:7.2f}x "
                   f"{f'{orc:.2f}x' if orc is not None else '-':>7}")
    out.append("  (step: one step in ordinary tokens; ceiling: every draft token accepted, modelled; "
               "oracle: the same, measured)")
    out.append(f"  {speedup_line(model, measured)}")
    out.append(f"  verdict             : {model.verdict}")
    return out
