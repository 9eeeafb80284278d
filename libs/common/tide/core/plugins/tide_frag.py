"""Tide's fragmentation score: FGD refined.

- the fragmentation increase is used at full resolution (the reference FGD truncates a sigmoid of
  it to an integer 0..100, so placements whose deltas differ by tens of milli-GPU tie);
- ``capacity_weight`` blends in CPU-aware fragmentation (``CapacityFragModel``): GPUs a node can no
  longer use because repeated pods of a typical shape run out of CPU or per-GPU room first;
- ``fit_weight`` adds a small best-fit term.
"""

from __future__ import annotations

import numpy as np
from tide.core.model import MILLI
from tide.core.plugins.base import Context
from tide.core.plugins.bestfit import bestfit_raw


class TideFragScore:
    name = "tide_frag"
    node_local = True

    def __init__(
        self, fgd_weight: float = 1.0, capacity_weight: float = 1.0, fit_weight: float = 0.0, quantum: float = 100.0,
        open_penalty: float = 0.0,
    ):
        self.fgd_weight = fgd_weight
        self.capacity_weight = capacity_weight
        self.fit_weight = fit_weight
        self.quantum = quantum
        self.open_penalty = open_penalty

    def score(self, ctx: Context) -> np.ndarray:
        out = np.zeros(len(ctx.cand))
        if self.fgd_weight and self.capacity_weight:
            ctx.frag_deltas()  # both in one pass
        if self.fgd_weight:
            out -= self.fgd_weight * ctx.frag_delta() / 10.0
        if self.capacity_weight:
            out -= self.capacity_weight * ctx.frag_delta(capacity=True) / 10.0
        if self.open_penalty:
            exists = ctx.cluster.gpu_exists[ctx.cand.node]
            idle_node = ((ctx.free_before == MILLI) | ~exists).all(axis=1) & exists.any(axis=1)
            out -= self.open_penalty / 10.0 * idle_node
        if self.quantum:
            out = np.round(out * 10.0 / self.quantum)
        if self.fit_weight:
            out += self.fit_weight * bestfit_raw(ctx)
        return out
