"""Throughput and acceptance against draft length (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

from .sweep import SweepResult

__all__ = ["plot_sweep"]


def plot_sweep(res: SweepResult, path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install 'llama-dflash[plot]'") from exc
    fig, (ax1, ax3) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax2 = ax1.twinx()
    for cell in res.cells:
        label = f"{cell.workload}, {cell.max_tokens} tok"
        ks = sorted(cell.speculative)
        tps = [cell.speculative[k].aggregate_tokens_per_second for k in ks]
        acc = [100 * cell.speculative[k].stats.acceptance_rate for k in ks]
        line, = ax1.plot(ks, tps, "o-", label=f"{label}: {res.algorithm}")
        ax1.axhline(cell.ordinary.aggregate_tokens_per_second, color=line.get_color(), ls=":",
                    label=f"{label}: ordinary")
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
