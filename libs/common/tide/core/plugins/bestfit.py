"""Best-fit: prefer the node with the least CPU and GPU left after placing (weighted 0.5/0.5).

Score = 100 * (1 - (0.5 * cpu_left / max_cpu + 0.5 * gpu_left / max_gpu)), as in the reference
simulator; ``quantize`` truncates it to an integer as the Kubernetes framework does (ties are then
broken at random by the placer), which is what reproduces the published numbers.
"""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context


def bestfit_raw(ctx: Context) -> np.ndarray:
    cand = ctx.cand
    left = 0.5 * cand.cpu_after / ctx.max_cpu() + 0.5 * cand.free_after.sum(axis=1) / ctx.max_gpu_milli()
    scores: np.ndarray = 100.0 * (1.0 - left)
    return scores


class BestFitScore:
    name = "bestfit"
    node_local = True

    def __init__(self, quantize: bool = True):
        self.quantize = quantize

    def score(self, ctx: Context) -> np.ndarray:
        raw = bestfit_raw(ctx)
        return np.floor(raw) if self.quantize else raw


class WorstFitScore:
    """Worst-fit / spread: the opposite of best-fit (keeps load even, leaves holes everywhere)."""

    name = "worstfit"
    node_local = True

    def score(self, ctx: Context) -> np.ndarray:
        return 100.0 - bestfit_raw(ctx)
