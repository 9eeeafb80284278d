"""Topology: prefer placements whose GPUs are close in the tree (NVLink < PCIe switch < NUMA < node).

A whole-GPU request for two or more GPUs scores each candidate node by the span of the GPUs it would get
there (``placer.whole_gpus_at``, the same choice the allocation makes): 100 when they share an NVLink
domain, 66.7 a PCIe switch, 33.3 a NUMA node, 0 when they only share the node. Other requests score 0.
"""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context
from tide.core.topology import Level, span


class TopologyScore:
    name = "topology"
    node_local = True  # the GPUs' free state and positions inside the node only

    def score(self, ctx: Context) -> np.ndarray:
        from tide.core.placer import whole_gpus_at  # noqa: PLC0415 (import cycle)

        cand, cluster, req = ctx.cand, ctx.cluster, ctx.request
        if req.kind != "whole" or req.gpu_count <= 1:
            return np.zeros(len(cand))
        out = np.empty(len(cand))
        for k, node in enumerate(cand.node):
            gpus = whole_gpus_at(cluster, req, int(node))
            level = span([cluster.position(int(node), g) for g in gpus])
            out[k] = 100.0 * (Level.NODE - min(level, Level.NODE)) / Level.NODE
        return out
