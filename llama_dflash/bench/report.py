"""The community feedback template, filled in from facts this program can know.

Nothing is made up: a field we cannot determine says "unknown".
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, Optional

from ..inspect import read_gguf
from ..stats import SpecStats
from .costmodel import PHASES, CostModel, speedup_line

__all__ = ["system_facts", "feedback_fields", "model_fields", "render_report", "parse_report", "TEMPLATE_FIELDS",
           "EXTRA_FIELDS"]

UNKNOWN = "unknown"

#: Field labels in the order of the feedback template.
TEMPLATE_FIELDS = [
    "llama-cpp-python version or commit", "Operating system", "Python version", "Backend", "GPU",
    "GPU memory", "Target model", "Target quantization", "Draft model", "Algorithm",
    "n_ctx", "n_batch", "n_ubatch", "draft_n_max", "draft_p_min", "backend sampling enabled", "ignore_eos",
    "Prompt or workload type", "Generated token count", "Ordinary throughput", "Speculative throughput",
    "Speedup",
    "Draft tokens proposed", "Draft tokens accepted", "Acceptance rate", "Verification steps",
    "Rollback count", "Target decode/sync time", "Draft time", "Process time",
    "Checkpoint capture/restore time",
    "Outputs deterministic across repeated runs", "First divergence from ordinary decoding",
    "Errors or warnings",
]


def _gpu_facts() -> tuple[str, str, str]:
    """(backend, gpu, gpu memory) from llama.cpp's own device list (see `backend`)."""
    try:
        from .backend import backend_info

        info = backend_info()
    except Exception:  # noqa: BLE001 - a report must still be written
        return UNKNOWN, UNKNOWN, UNKNOWN
    return info.name, info.gpu, info.gpu_memory


def system_facts() -> dict[str, str]:
    import llama_cpp

    backend, gpu, mem = _gpu_facts()
    return {
        "llama-cpp-python version or commit": str(getattr(llama_cpp, "__version__", UNKNOWN)),
        "Operating system": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "Python version": sys.version.split()[0],
        "Backend": backend,
        "GPU": gpu,
        "GPU memory": mem,
    }


#: Fields beyond the template, written after it in every section.
EXTRA_FIELDS = [
    "Tokens per verification step (tau)", "Accepted drafts per verification step", "Predicted speedup",
    "Cost model", "Oracle ceiling", "Per-step cost by phase", "Per-speculator counts",
]


def model_fields(stats: Optional[SpecStats], model: Optional[CostModel], measured: dict[Any, float],
                 phases: Optional[dict[str, Any]], oracle: Optional[tuple[Any, float]]) -> dict[str, str]:
    """tau, the cost model's prediction and verdict, the oracle ceiling and the phase table, as text."""
    f: dict[str, str] = {}
    if stats is not None:
        f["Tokens per verification step (tau)"] = f"{stats.tokens_per_step:.2f} (accepted + 1)"
        f["Accepted drafts per verification step"] = f"{stats.accepted_per_step:.2f}"
    if model is not None:
        f["Predicted speedup"] = speedup_line(model, measured)
        f["Cost model"] = model.verdict
    f["Oracle ceiling"] = (f"{oracle[1]:.3f}x at draft tokens {oracle[0]} (measured; every draft token right)"
                           if oracle else "not measured (add --oracle)")
    if phases:
        unit = phases["unit_seconds"]
        rows = [("ord.", phases["ordinary"]), *phases["draft_tokens"].items()]
        f["Per-step cost by phase"] = f"in ordinary decodes ({1000 * unit:.2f} ms): " + "; ".join(
            f"{k}: " + ", ".join(f"{p} {row[p]:.2f}" for p in (*PHASES, "total")) for k, row in rows)
    return {k: f[k] for k in EXTRA_FIELDS if k in f}


def _fmt_s(x: float) -> str:
    return f"{x:.3f} s"


def feedback_fields(
    *,
    model: str,
    draft_model: Optional[str],
    algorithm: str,
    n_ctx: int,
    n_batch: int,
    n_ubatch: int,
    draft_n_max: Any,
    draft_p_min: float,
    backend_sampling: "bool | str",
    ignore_eos: bool,
    workload: str,
    generated_tokens: int,
    ordinary_tps: float,
    speculative_tps: float,
    stats: Optional[SpecStats],
    deterministic: Optional[bool],
    first_divergence: Optional[int],
    warnings: list[str],
    extras: Optional[dict[str, str]] = None,
) -> dict[str, str]:
    """Every template field, as text, then `extras` (see `model_fields`)."""
    t = read_gguf(model)
    d = read_gguf(draft_model) if draft_model else None
    f = system_facts()
    f.update({
        "Target model": os.path.basename(model),
        "Target quantization": t.file_type or UNKNOWN,
        "Draft model": f"{os.path.basename(draft_model)} ({d.file_type})" if d is not None
                       else f"none (token drafters: {algorithm})",
        "Algorithm": {"dflash": "DFlash", "dspark": "DSpark"}.get(algorithm, algorithm),
        "n_ctx": str(n_ctx),
        "n_batch": str(n_batch),
        "n_ubatch": str(n_ubatch),
        "draft_n_max": str(draft_n_max),
        "draft_p_min": f"{draft_p_min:g}",
        "backend sampling enabled": (
            f"{backend_sampling} (active: {stats.backend_sampling_active})" if stats else str(backend_sampling)
        ),
        "ignore_eos": str(ignore_eos),
        "Prompt or workload type": workload,
        "Generated token count": str(generated_tokens),
        "Ordinary throughput": f"{ordinary_tps:.2f} token/s",
        "Speculative throughput": f"{speculative_tps:.2f} token/s",
        "Speedup": f"{speculative_tps / ordinary_tps:.3f}x" if ordinary_tps else UNKNOWN,
    })
    if stats is not None:
        ckpt = (f"{_fmt_s(stats.checkpoint_capture_seconds)} capture ({stats.checkpoint_captures}), "
                f"{_fmt_s(stats.checkpoint_restore_seconds + stats.replay_seconds)} restore+replay "
                f"({stats.checkpoint_restores}, {stats.replayed_tokens} tokens replayed), "
                f"{stats.checkpoint_bytes} bytes each, {'on device' if stats.checkpoint_on_device else 'host'}"
                if stats.checkpoint_captures else f"none (rollback mode: {stats.rollback_mode})")
        f.update({
            "Draft tokens proposed": str(stats.drafted),
            "Draft tokens accepted": str(stats.accepted),
            "Acceptance rate": f"{100 * stats.acceptance_rate:.1f}%",
            "Verification steps": str(stats.verification_steps),
            "Rollback count": f"{stats.rollbacks} (native: {stats.native_rollbacks})",
            "Target decode/sync time": _fmt_s(stats.target_seconds),
            "Draft time": _fmt_s(stats.draft_seconds),
            "Process time": _fmt_s(stats.process_seconds),
            "Checkpoint capture/restore time": ckpt,
        })
    f["Outputs deterministic across repeated runs"] = UNKNOWN if deterministic is None else str(deterministic)
    f["First divergence from ordinary decoding"] = (
        "none (outputs identical)" if first_divergence is None else f"generated token {first_divergence}"
    )
    f["Errors or warnings"] = "; ".join(w.replace("\n", " ") for w in warnings[:10]) or "none"
    return {**{k: f.get(k, UNKNOWN) for k in TEMPLATE_FIELDS}, **(extras or {})}


def render_report(sections: list[tuple[str, dict[str, str]]], summary: str) -> str:
    """Markdown: one filled template per section, then the printed summary."""
    out = ["# DFlash/DSpark speculative decoding feedback", ""]
    for title, fields in sections:
        out += [f"## {title}", ""]
        out += [f"{k}: {v}" for k, v in fields.items()]
        out.append("")
    out += ["## Full summary", "", "```", summary, "```", ""]
    return "\n".join(out)


def parse_report(text: str) -> list[dict[str, str]]:
    """The fields of every section of a report written by render_report (for tests and tools)."""
    sections: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append({})
        elif sections and ": " in line and line.split(": ", 1)[0] in TEMPLATE_FIELDS:
            k, v = line.split(": ", 1)
            sections[-1][k] = v
    return [s for s in sections if s]
