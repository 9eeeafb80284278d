"""The exhaustive optimum of gang communication cost on small clusters (for tests and benchmarks).

Cost of a plan = sum over pod pairs of ``LEVEL_COST`` of the level they share. Pods on one node
get their GPUs as the gang solver gives them (``pick_gpus`` over the node's free GPUs), so a plan
is a count of pods per node; the search enumerates those counts with branch and bound.
"""

from __future__ import annotations

import numpy as np

from tide.core.cluster import Cluster
from tide.core.filtering import node_filter
from tide.core.gang import LEVEL_COST, _node_allocations, comm_cost, node_capacity, pod_position
from tide.core.model import PodRequest
from tide.core.topology import distance


def optimum_cost(cluster: Cluster, req: PodRequest, n: int) -> float | None:
    """The least communication cost of any placement of ``n`` pods, or None if none fits."""
    mask, _ = node_filter(cluster, req)
    cap = node_capacity(cluster, req, mask)
    nodes = [int(i) for i in np.flatnonzero(cap > 0)]
    if cap[nodes].sum() < n:
        return None
    within: dict[tuple[int, int], float] = {}
    for i in nodes:
        for k in range(1, min(int(cap[i]), n) + 1):
            allocs = _node_allocations(cluster, req, i, k, None)
            within[(i, k)] = comm_cost([pod_position(cluster, a) for a in allocs])
    pair = {(a, b): LEVEL_COST[distance(cluster.position(a), cluster.position(b))] for a in nodes for b in nodes}
    best = [float("inf")]
    counts: list[tuple[int, int]] = []
    suffix_cap = [int(cap[nodes[j:]].sum()) for j in range(len(nodes))] + [0]

    def search(j: int, left: int, cost: float) -> None:
        if cost >= best[0]:
            return
        if left == 0:
            best[0] = cost
            return
        if j == len(nodes) or suffix_cap[j] < left:
            return
        node = nodes[j]
        for k in range(min(int(cap[node]), left), -1, -1):
            extra = within.get((node, k), 0.0) + sum(k * c * pair[(node, other)] for other, c in counts)
            if k:
                counts.append((node, k))
            search(j + 1, left - k, cost + extra)
            if k:
                counts.pop()

    search(0, n, 0.0)
    return best[0]
