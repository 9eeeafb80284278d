"""Topology-aware gang placement (pure): all pods of a gang in one step, closest first.

A gang of ``n`` identical pods is placed inside one *domain* of the topology tree (a NUMA node,
a node, a rack, a spine, or the whole cluster). For each candidate domain the solver fills as
few nodes as possible (largest capacity first, and best fit for the last node so that bigger
nodes stay whole), picks each node's GPUs together (``pick_gpus``) and scores the plan by its
communication cost: the sum over pod pairs of the cost of the tree level they share. Among
plans it keeps the one that (1) honours ``topology.prefer`` if any does, (2) has the lowest
cost, (3) leaves the least free GPU capacity in the nodes it touches (bin-packing: whole
domains stay free for larger gangs). ``topology.require`` is a hard limit: only domains of that
level (or finer) are candidates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tide.core.cluster import Cluster
from tide.core.filtering import node_filter, share_free, whole_free
from tide.core.model import MILLI, Allocation, PodRequest, Unfit
from tide.core.topology import GpuPosition, Level, distance, pick_gpus, span

# Cost of one pod pair by the deepest tree level they share (GPUs of one pod count as one position).
LEVEL_COST: dict[Level, float] = {
    Level.NVLINK: 1.0,
    Level.PCIE_SWITCH: 2.0,
    Level.NUMA: 3.0,
    Level.NODE: 4.0,
    Level.RACK: 10.0,
    Level.SPINE: 20.0,
    Level.CLUSTER: 40.0,
}
DOMAIN_LEVELS = (Level.NUMA, Level.NODE, Level.RACK, Level.SPINE, Level.CLUSTER)
CANDIDATES_PER_LEVEL = 6  # the fullest domains that fit, per level (bin-packing order)


@dataclass(frozen=True)
class GangPlan:
    allocations: tuple[Allocation, ...]
    cost: float
    span: Level
    free_after: int


def pod_position(cluster: Cluster, alloc: Allocation) -> GpuPosition:
    node = cluster.index[alloc.node_id]
    if alloc.gpu_indices:
        return cluster.position(node, alloc.gpu_indices[0])
    if alloc.mig is not None:
        return cluster.position(node, alloc.mig.gpu_index)
    return cluster.position(node)


def comm_cost(positions: list[GpuPosition]) -> float:
    total = 0.0
    for i in range(len(positions)):
        for j in range(i + 1, len(positions)):
            total += LEVEL_COST[distance(positions[i], positions[j])]
    return total


def node_capacity(
    cluster: Cluster, req: PodRequest, nodes: np.ndarray, gpu_mask: np.ndarray | None = None
) -> np.ndarray:
    """How many pods like ``req`` each node could take now (0 for nodes outside ``nodes``)."""
    cap = np.full(cluster.num_nodes, 1 << 30, dtype=np.int64)
    if req.cpu_milli:
        cap = np.minimum(cap, cluster.cpu_free // req.cpu_milli)
    if req.memory_mib:
        cap = np.minimum(cap, cluster.mem_free // req.memory_mib)
    if req.kind == "whole":
        free = whole_free(cluster, req) if gpu_mask is None else whole_free(cluster, req) & gpu_mask
        cap = np.minimum(cap, free.sum(axis=1) // req.gpu_count)
    elif req.kind == "share":
        fits = share_free(cluster, req) if gpu_mask is None else share_free(cluster, req) & gpu_mask
        per_gpu = np.minimum(
            cluster.milli_free // max(req.gpu_milli, 1),
            cluster.gpu_mem_free // max(req.gpu_mem_mib, 1) if req.gpu_mem_mib else 1 << 30,
        )
        cap = np.minimum(cap, np.where(fits, per_gpu, 0).sum(axis=1))
    elif req.kind == "mig":
        cap[:] = 0  # MIG gangs go pod by pod through the core placer
    return np.where(nodes, cap, 0)


def _node_allocations(
    cluster: Cluster, req: PodRequest, node: int, count: int, gpu_mask: np.ndarray | None
) -> list[Allocation]:
    node_id = cluster.node_ids[node]
    common: dict[str, Any] = {"node_id": node_id, "cpu_milli": req.cpu_milli, "memory_mib": req.memory_mib}
    if req.kind == "whole":
        free = whole_free(cluster, req)[node]
        if gpu_mask is not None:
            free = free & gpu_mask[node]
        positions = [cluster.position(node, g) for g in range(int(cluster.ngpu[node]))]
        chosen = pick_gpus([int(g) for g in np.flatnonzero(free)], positions, count * req.gpu_count)
        out = []
        for p in range(count):
            gpus = chosen[p * req.gpu_count:(p + 1) * req.gpu_count]
            out.append(Allocation(gpu_indices=gpus, gpu_milli=(MILLI,) * len(gpus),
                                  gpu_mem_mib=tuple(int(cluster.gpu_mem_cap[node, g]) for g in gpus), **common))
        return out
    if req.kind == "share":
        milli = cluster.milli_free[node].copy()
        mem = cluster.gpu_mem_free[node].copy()
        ok = share_free(cluster, req)[node] if gpu_mask is None else share_free(cluster, req)[node] & gpu_mask[node]
        out = []
        for _ in range(count):
            fits = ok & (milli >= req.gpu_milli) & (mem >= req.gpu_mem_mib)
            candidates = np.flatnonzero(fits)
            g = int(candidates[np.argmin(milli[candidates])])  # best fit: the fullest GPU that fits
            milli[g] -= req.gpu_milli
            mem[g] -= req.gpu_mem_mib
            out.append(Allocation(gpu_indices=(g,), gpu_milli=(req.gpu_milli,), gpu_mem_mib=(req.gpu_mem_mib,),
                                  **common))
        return out
    return [Allocation(**common) for _ in range(count)]


def _choose_nodes(cap: np.ndarray, members: np.ndarray, n: int, free_gpus: np.ndarray) -> list[tuple[int, int]]:
    """Fewest nodes holding ``n`` pods: largest first, best fit for the last. Returns (node, pods)."""
    left = n
    pool = [int(i) for i in members if cap[i] > 0]
    chosen: list[tuple[int, int]] = []
    while left > 0 and pool:
        fitting = [i for i in pool if cap[i] >= left]
        if fitting:
            best = min(fitting, key=lambda i: (cap[i], free_gpus[i], i))
            chosen.append((best, left))
            return chosen
        best = max(pool, key=lambda i: (cap[i], -free_gpus[i], -i))
        chosen.append((best, int(cap[best])))
        left -= int(cap[best])
        pool.remove(best)
    return [] if left > 0 else chosen


LOCAL_SEARCH_NODES = 16  # nodes of a domain the local search may move pods to (the roomiest)


def _improve(
    cluster: Cluster, req: PodRequest, chosen: list[tuple[int, int]], members: list[int], cap: np.ndarray
) -> list[tuple[int, int]]:
    """Local search on pods per node: move pods (one, or a node's all) while the cost drops."""
    pool = sorted(members, key=lambda i: -int(cap[i]))[:LOCAL_SEARCH_NODES]
    pool = sorted(set(pool) | {i for i, _ in chosen})
    within: dict[tuple[int, int], float] = {}

    def inside(i: int, k: int) -> float:
        if k <= 1:
            return 0.0
        if (i, k) not in within:
            allocs = _node_allocations(cluster, req, i, k, None)
            within[(i, k)] = comm_cost([pod_position(cluster, a) for a in allocs])
        return within[(i, k)]

    pos = {i: cluster.position(i) for i in pool}
    pair = {(a, b): LEVEL_COST[distance(pos[a], pos[b])] for a in pool for b in pool if a != b}

    def cost(counts: dict[int, int]) -> float:
        items = [(i, k) for i, k in counts.items() if k]
        total = sum(inside(i, k) for i, k in items)
        for x in range(len(items)):
            for y in range(x + 1, len(items)):
                total += items[x][1] * items[y][1] * pair[(items[x][0], items[y][0])]
        return total

    counts = dict(chosen)
    best = cost(counts)
    improved = True
    while improved:
        improved = False
        for a in [i for i, k in counts.items() if k]:
            for b in pool:
                if b == a:
                    continue
                for moved in {1, counts[a]}:
                    if counts.get(b, 0) + moved > cap[b]:
                        continue
                    trial = dict(counts)
                    trial[a] -= moved
                    trial[b] = trial.get(b, 0) + moved
                    c = cost(trial)
                    if c < best - 1e-9:
                        counts, best, improved = trial, c, True
                        break
                if improved:
                    break
            if improved:
                break
    return [(i, k) for i, k in counts.items() if k]


def _fill(cluster: Cluster, cap: np.ndarray, members: list[int], n: int, free_gpus: np.ndarray,
          level: Level) -> list[tuple[int, int]]:
    """Fill ``n`` pods into a domain child by child (fewest racks, then fewest nodes): the roomiest
    children first, and for the remainder the child that fits it most tightly."""
    if level <= Level.NODE:
        return _choose_nodes(cap, np.array(members), n, free_gpus)
    child = Level(level - 1)
    groups = [g for g in _domains(cluster, child, members).values() if cap[g].sum() > 0]
    left = n
    chosen: list[tuple[int, int]] = []
    while left > 0 and groups:
        fitting = [g for g in groups if cap[g].sum() >= left]
        if fitting:
            g = min(fitting, key=lambda g: (int(cap[g].sum()), int(free_gpus[g].sum())))
            return chosen + _fill(cluster, cap, g, left, free_gpus, child)
        g = max(groups, key=lambda g: (int(cap[g].sum()), -int(free_gpus[g].sum())))
        take = int(cap[g].sum())
        chosen += _fill(cluster, cap, g, take, free_gpus, child)
        left -= take
        groups.remove(g)
    return chosen if left == 0 else []


def _domains(cluster: Cluster, level: Level, nodes: Iterable[int]) -> dict[tuple[str, ...], list[int]]:
    groups: dict[tuple[str, ...], list[int]] = {}
    for i in nodes:
        if level <= Level.NODE:
            key: tuple[str, ...] = (cluster.node_ids[i],)
        elif level == Level.RACK:
            key = (cluster.spines[i], cluster.racks[i])
        elif level == Level.SPINE:
            key = (cluster.spines[i],)
        else:
            key = ()
        groups.setdefault(key, []).append(i)
    return groups


def _numa_candidates(
    cluster: Cluster, req: PodRequest, mask: np.ndarray, cap: np.ndarray, n: int
) -> list[tuple[int, np.ndarray]]:
    """(node, GPU mask) for every NUMA node that alone holds the gang, fullest first."""
    if req.kind == "whole":
        free = whole_free(cluster, req) & mask[:, None]
    elif req.kind == "share":
        free = share_free(cluster, req) & mask[:, None]
    else:
        return []
    out: list[tuple[int, int, np.ndarray]] = []
    for numa in np.unique(cluster.numa[cluster.gpu_exists]):
        in_numa = cluster.gpu_exists & (cluster.numa == numa)
        if req.kind == "whole":
            fits = (free & in_numa).sum(axis=1) // req.gpu_count
        else:
            per_gpu = cluster.milli_free // max(req.gpu_milli, 1)
            if req.gpu_mem_mib:
                per_gpu = np.minimum(per_gpu, cluster.gpu_mem_free // req.gpu_mem_mib)
            fits = np.where(free & in_numa, per_gpu, 0).sum(axis=1)
        fits = np.minimum(fits, cap_without_gpus(cluster, req, mask))
        for i in np.flatnonzero(fits >= n):
            gm = np.zeros_like(cluster.gpu_exists)
            gm[i] = in_numa[i]
            out.append((int(fits[i]), int(i), gm))
    out.sort(key=lambda t: (t[0], t[1]))
    return [(i, gm) for _, i, gm in out[:CANDIDATES_PER_LEVEL]]


def cap_without_gpus(cluster: Cluster, req: PodRequest, mask: np.ndarray) -> np.ndarray:
    cap = np.full(cluster.num_nodes, 1 << 30, dtype=np.int64)
    if req.cpu_milli:
        cap = np.minimum(cap, cluster.cpu_free // req.cpu_milli)
    if req.memory_mib:
        cap = np.minimum(cap, cluster.mem_free // req.memory_mib)
    return np.where(mask, cap, 0)


def place_gang(
    cluster: Cluster,
    req: PodRequest,
    n: int,
    require: Level | None = None,
    prefer: Level | None = None,
    exclude: Iterable[str] = (),
) -> GangPlan | Unfit:
    """The best plan for ``n`` pods like ``req``, or why none fits now. ``cluster`` is not changed."""
    mask, reasons = node_filter(cluster, req)
    for node_id in exclude:
        if node_id in cluster.index:
            mask[cluster.index[node_id]] = False
    free_gpus = (cluster.milli_free * cluster.gpu_exists).sum(axis=1)
    cap = node_capacity(cluster, req, mask)
    best: tuple[tuple[Any, ...], GangPlan] | None = None
    levels = [lv for lv in DOMAIN_LEVELS if require is None or lv <= max(require, Level.NUMA)]
    for level in levels:
        candidates: list[tuple[list[tuple[int, int]], np.ndarray | None]] = []
        if level == Level.NUMA:
            # all pods on one NUMA node of one node (covers nvlink / pcie-switch / numa requirements)
            candidates = [([(i, n)], gm) for i, gm in _numa_candidates(cluster, req, mask, cap, n)]
        else:
            domains = [m for m in _domains(cluster, level, np.flatnonzero(cap > 0)).values() if cap[m].sum() >= n]
            domains.sort(key=lambda m: (int(cap[m].sum()), int(free_gpus[m].sum())))
            for members in domains[:CANDIDATES_PER_LEVEL]:
                chosen = _fill(cluster, cap, members, n, free_gpus, level)
                if chosen and len(chosen) > 1:
                    chosen = _improve(cluster, req, chosen, members, cap)
                if chosen:
                    candidates.append((chosen, None))
        for chosen, gm in candidates:
            allocs: list[Allocation] = []
            for node, count in chosen:
                allocs.extend(_node_allocations(cluster, req, node, count, gm))
            positions = [pod_position(cluster, a) for a in allocs]
            cost, sp = comm_cost(positions), span(positions)
            if require is not None and sp > require:
                continue
            touched = {cluster.index[a.node_id] for a in allocs}
            used = sum(sum(a.gpu_milli) for a in allocs)
            free_after = int(sum(free_gpus[i] for i in touched) - used)
            key = (prefer is not None and sp > prefer, cost, free_after)
            if best is None or key < best[0]:
                best = (key, GangPlan(tuple(allocs), cost, sp, free_after))
    if best is not None:
        return best[1]
    total = int(cap.sum())
    where = f" within one {require.name.lower().replace('_', '-')}" if require is not None else ""
    if require is not None and total >= n:
        top = max((int(cap[m].sum()) for m in _domains(cluster, max(require, Level.NODE),
                                                       np.flatnonzero(cap > 0)).values()), default=0)
        return Unfit(f"needs {n} pods{where}; the best {require.name.lower()} has room for {top}", True)
    detail = f" ({'; '.join(reasons)})" if reasons else ""
    return Unfit(f"needs {n} pods{where}; the free capacity holds {total}{detail}", True)
