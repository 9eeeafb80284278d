"""Dot product (Tetris-style alignment): prefer nodes whose free (CPU, GPU) vector points the same
way as the request, normalised per dimension by the largest node."""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context


class DotProductScore:
    name = "dotproduct"
    node_local = True

    def score(self, ctx: Context) -> np.ndarray:
        req = ctx.request
        cpu_free = ctx.cluster.cpu_free[ctx.cand.node] / ctx.max_cpu()
        gpu_free = ctx.free_before.sum(axis=1) / ctx.max_gpu_milli()
        r_cpu = req.cpu_milli / ctx.max_cpu()
        r_gpu = req.total_gpu_milli / ctx.max_gpu_milli()
        # lower dot product of remaining resources with the request = tighter packing
        scores: np.ndarray = -100.0 * (cpu_free * r_cpu + gpu_free * r_gpu)
        return scores
