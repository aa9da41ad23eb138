"""Human-readable summary of a benchmark, in the layout testers already paste into reports."""

from __future__ import annotations

import os

from .runner import BenchResult, ModeResult

__all__ = ["format_header", "format_result"]


def format_header(res: BenchResult) -> str:
    c = res.config
    lines = [
        f"Target model   : {os.path.basename(c.target.model)}",
        f"Draft model    : {os.path.basename(c.spec.draft_model)}",
        f"Algorithm      : {res.algorithm}",
        f"Prompt         : {c.prompt!r}",
        f"Measured runs  : {c.runs} x {c.max_tokens} tokens per mode",
        f"Warmup         : {c.warmup_tokens} tokens per mode",
        f"Draft settings : max={'auto (adaptive, up to ' + str(res.draft_n_max) + ')' if c.spec.adaptive else res.draft_n_max}"
        f", min={c.spec.draft_n_min}, p_min={c.spec.draft_p_min:g}",
        f"Backend sample : {'enabled' if c.spec.backend_sampling else 'disabled'}",
        f"Ignore EOG     : {c.ignore_eos}",
        "Limitations    : text-only, seq_id=0",
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
            f"  mean accepted length: {s.mean_accepted_length:.2f}",
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
    return "\n".join(lines)
