"""GPU packing: put shares on already-shared GPUs, whole GPUs on already-busy nodes.

Score tiers: a share landing on a partly used GPU (100) > any pod on a node with some GPU in use (50 +)
> an idle node (0 +); inside a tier, fewer free GPUs left is better.
"""

from __future__ import annotations

import numpy as np
from tide.core.model import MILLI
from tide.core.plugins.base import Context


class GpuPackingScore:
    name = "gpupacking"
    node_local = True

    def score(self, ctx: Context) -> np.ndarray:
        cand, before = ctx.cand, ctx.free_before
        cluster = ctx.cluster
        exists = cluster.gpu_exists[cand.node]
        node_busy = ((before < MILLI) & exists).any(axis=1)
        full_left = ((cand.free_after == MILLI) & exists).sum(axis=1) / max(cluster.gpu_exists.shape[1], 1)
        score: np.ndarray = np.where(node_busy, 50.0, 0.0) + 40.0 * (1.0 - full_left)
        if ctx.request.gpu_milli:
            g = np.maximum(cand.gpu, 0)
            on_shared = before[np.arange(len(cand)), g] < MILLI
            score = np.where(on_shared, 100.0 + (MILLI - cand.free_after[np.arange(len(cand)), g]) / 100, score)
        return score
