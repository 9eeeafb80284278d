"""Topology: prefer placements whose GPUs are close in the tree (NVLink < PCIe < NUMA < node)."""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context
from tide.core.topology import Level, span


class TopologyScore:
    name = "topology"
    node_local = True

    def score(self, ctx: Context) -> np.ndarray:
        cand = ctx.cand
        if not cand.whole_gpus or ctx.request.gpu_count <= 1:
            return np.zeros(len(cand))
        out = np.empty(len(cand))
        for k, (node, gpus) in enumerate(zip(cand.node, cand.whole_gpus, strict=True)):
            level = span([ctx.cluster.position(int(node), g) for g in gpus])
            out[k] = 100.0 * (Level.NODE - min(level, Level.NODE)) / Level.NODE
        return out
