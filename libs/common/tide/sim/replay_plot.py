"""Plot GPU allocation over (virtual) time for replay results, with the workload's offered load."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def plot_replay(results: Sequence[dict], path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    if results:
        s = results[0]["series"]
        ax.fill_between(s["t_h"], [min(x, 150) for x in s["offered_pct"]], color="grey", alpha=0.2,
                        label="offered (if every job started on arrival)")
    for res in results:
        s = res["series"]
        ax.plot(s["t_h"], s["alloc_pct"], lw=1.2, label=f"{res['capabilities']['name']}")
    ax.axhline(90, color="grey", lw=0.6, ls=":")
    ax.set(xlabel="virtual time (h)", ylabel="GPU allocated (% of capacity)", ylim=(0, 105))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
