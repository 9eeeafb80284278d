"""Plot allocation and fragmentation against arrived demand for one or more simulation results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def plot_results(results: Sequence[dict], path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for res in results:
        xs = [p["arrived_pct"] for p in res["curve"]]
        label = f"{res['policy']} ({res['allocated_pct_at_100']:.1f}% @100)"
        ax1.plot(xs, [p["allocated_pct"] for p in res["curve"]], label=label)
        ax2.plot(xs, [p["frag_pct"] for p in res["curve"]], label=res["policy"])
    ax1.plot([0, 130], [0, 130], color="grey", lw=0.6, ls=":")
    ax1.set(xlabel="arrived GPU demand (% of capacity)", ylabel="allocated GPU (% of capacity)", xlim=(0, 130),
            ylim=(0, 100))
    ax1.axvline(100, color="grey", lw=0.6)
    ax2.set(xlabel="arrived GPU demand (% of capacity)", ylabel="fragmented GPU (% of capacity)", xlim=(0, 130))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
