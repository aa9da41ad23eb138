"""Throughput and acceptance against draft length (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

from .costmodel import PHASES
from .sweep import SweepResult

__all__ = ["plot_sweep"]


def plot_sweep(res: SweepResult, path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install 'llama-dflash[plot]'") from exc
    fig, (ax1, ax3, ax4) = plt.subplots(1, 3, figsize=(18, 4.8))
    ax2 = ax1.twinx()
    for cell in res.cells:
        label = f"{cell.workload}, {cell.max_tokens} tok"
        ks = sorted(k for k in cell.speculative if k != "auto")
        if not ks:  # only "auto": nothing to draw against draft length
            continue
        tps = [cell.speculative[k].aggregate_tokens_per_second for k in ks]
        acc = [100 * cell.speculative[k].stats.acceptance_rate for k in ks]
        line, = ax1.plot(ks, tps, "o-", label=f"{label}: {res.algorithm}")
        ax1.axhline(cell.ordinary.aggregate_tokens_per_second, color=line.get_color(), ls=":",
                    label=f"{label}: ordinary")
        if "auto" in cell.speculative:
            ax1.axhline(cell.speculative["auto"].aggregate_tokens_per_second, color=line.get_color(), ls="-.",
                        label=f"{label}: adaptive length")
        if cell.default is not None:
            ax1.axhline(cell.default.aggregate_tokens_per_second, color=line.get_color(), ls="--",
                        label=f"{label}: spec-type auto (the default)")
        if cell.oracle:
            oks = sorted(cell.oracle)
            ax1.plot(oks, [cell.oracle[k].aggregate_tokens_per_second for k in oks], "^:", color=line.get_color(),
                     alpha=0.7, label=f"{label}: oracle")
        ax2.plot(ks, acc, "s--", color=line.get_color(), alpha=0.6)
        best_k = max(ks, key=lambda k: cell.speculative[k].stats.draft_n_max)
        pos = cell.speculative[best_k].stats.acceptance_per_position
        ax3.plot(range(1, len(pos) + 1), [100 * p for p in pos], "o-", color=line.get_color(),
                 label=f"{label} (draft {best_k})")
    ax1.set_xlabel("draft tokens (draft_n_max)")
    ax1.set_ylabel("throughput (token/s), solid; ordinary dotted")
    ax2.set_ylabel("acceptance rate (%), dashed")
    ax2.set_ylim(0, 100)
    ax1.set_title("Throughput and acceptance vs draft length")
    ax1.legend(fontsize=7, loc="best")
    ax3.set_xlabel("draft position")
    ax3.set_ylabel("accepted (%)")
    ax3.set_title("Acceptance per draft position")
    ax3.set_ylim(0, 100)
    ax3.legend(fontsize=7)
    _plot_phases(ax4, res.cells[0])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_phases(ax, cell) -> None:
    """Stacked per-step phase costs (ordinary decodes) of each draft length, with the oracle ceiling."""
    table = cell.phase_table()
    rows = [("ord.", table["ordinary"]), *((k, r) for k, r in table["draft_tokens"].items()
                                           if not k.startswith("oracle"))]
    labels = [k for k, _ in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        vals = [r[phase] for _, r in rows]
        ax.bar(labels, vals, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, (_, r) in enumerate(rows):
        ax.annotate(f"tau {r['tokens_per_step']:.2f}", (i, bottom[i]), ha="center", va="bottom", fontsize=7)
    ceiling = cell.oracle_ceiling
    title = "Per-step cost by phase"
    if ceiling is not None:
        title += f" (oracle ceiling {ceiling[1]:.2f}x at k={ceiling[0]})"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"draft tokens ({cell.workload}, {cell.max_tokens} tok)")
    ax.set_ylabel(f"ordinary decodes (1 = {1000 * table['unit_seconds']:.1f} ms)")
    ax.legend(fontsize=7)
