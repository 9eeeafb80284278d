"""Plot GPU allocation over (virtual) time for replay results, with the workload's offered load."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def _draw_allocation(ax: Any, results: Sequence[dict], lw: float, colour: Callable[[str], str] | None = None) -> None:
    """One panel: the offered load (shaded) and each rung's allocation over virtual time, with the 90 % line."""
    if results:
        s = results[0]["series"]
        ax.fill_between(s["t_h"], [min(x, 150) for x in s["offered_pct"]], color="grey", alpha=0.2,
                        label="offered (if every job started on arrival)")
    for res in results:
        s = res["series"]
        name = res["capabilities"]["name"]
        ax.plot(s["t_h"], s["alloc_pct"], lw=lw, label=name, **({"color": colour(name)} if colour else {}))
    ax.axhline(90, color="grey", lw=0.6, ls=":")


def plot_replay(results: Sequence[dict], path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    _draw_allocation(ax, results, lw=1.2)
    ax.set(xlabel="virtual time (h)", ylabel="GPU allocated (% of capacity)", ylim=(0, 105))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_replay_seeds(by_seed: Mapping[int, Sequence[dict]], path: str | Path, title: str = "",
                      order: Sequence[str] = ()) -> None:
    """``plot_replay`` for several seeds (each its own workload and time axis): one panel per seed; a rung
    has the same colour in every panel (``order``: rung names, the colour cycle's order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = list(by_seed)
    names = list(order)
    for results in by_seed.values():
        names += [r["capabilities"]["name"] for r in results if r["capabilities"]["name"] not in names]
    fig, axes = plt.subplots(len(seeds), 1, figsize=(10, 3.2 * len(seeds) + 0.6), sharex=True, squeeze=False)
    for ax, seed in zip(axes[:, 0], seeds, strict=True):
        results = by_seed[seed]
        _draw_allocation(ax, results, lw=1.1, colour=lambda name: f"C{names.index(name) % 10}")
        gpus = results[0]["gpus"] if results else 0
        ax.set(ylabel="GPU allocated (%)", ylim=(0, 105))
        ax.set_title(f"seed {seed} ({gpus} GPUs)", fontsize=9)
        ax.grid(alpha=0.3)
    handles = {h.get_label(): h for ax in axes[:, 0] for h in ax.get_lines() + ax.collections}
    labels = [n for n in ["offered (if every job started on arrival)", *names] if n in handles]
    axes[0, 0].legend([handles[n] for n in labels], labels, fontsize=7, loc="lower right", ncol=2)
    axes[-1, 0].set_xlabel("virtual time (h)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
