"""Job placement for the placer and the replay (pure): a job spec and the cluster in, pod allocations out.

The decisions are the placement core's (``tide.core``): a single pod without topology needs goes
through the policy placer (fragmentation-aware by default); a gang, or a pod with topology needs,
goes through the topology-aware gang solver. This module turns a job into pod requests, places the
gang all-or-nothing, explains why not, and turns allocations into the Redis claim items that make
them stick.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from tide.core import (
    MILLI,
    PROFILES_BY_MODEL,
    Allocation,
    Cluster,
    Placer,
    PodRequest,
    Unfit,
    never_fits,
    profiles_for,
)
from tide.core.feedback import applied_multiplier, effective_share_mib
from tide.core.gang import place_gang
from tide.core.topology import Level
from tide.schemas.events import JobRecord, PodState
from tide.schemas.feedback import AFFINITY_PREFER_NODE, FamilyWeights
from tide.schemas.job import JobSpec
from tide.schemas.node import NodeDescription

MIG_SLICE_MILLI = MILLI // 7  # a MIG compute slice in milli-GPU, so a whole-GPU claim cannot overlap MIG


@dataclass(frozen=True)
class PodPlacement:
    pod_index: int
    alloc: Allocation


def pod_request(spec: JobSpec, feedback: FamilyWeights | None = None, max_gpu_mem_mib: int = 0) -> PodRequest:
    """A pod of ``spec`` as the core sees it; the feedback loop raises a share's GPU memory for its family
    (by the part of the multiplier its spec does not already carry), capped at the largest GPU."""
    tmpl = spec.spec.template
    request = PodRequest.from_resources(tmpl.resources, tmpl.node_selector)
    if feedback is None or request.kind != "share":
        return request
    factor = feedback.memory_multiplier / applied_multiplier(spec)
    memory = effective_share_mib(request.gpu_mem_mib, factor, max_gpu_mem_mib or None)
    return replace(request, gpu_mem_mib=max(request.gpu_mem_mib, memory))


def topology_levels(spec: JobSpec, feedback: FamilyWeights | None = None) -> tuple[Level | None, Level | None]:
    """(require, prefer); a family with high measured cross-node traffic prefers one node."""
    require, prefer = _level(spec.spec.topology.require), _level(spec.spec.topology.prefer)
    if prefer is None and feedback is not None and feedback.affinity >= AFFINITY_PREFER_NODE:
        prefer = Level.NODE
    return require, prefer


def _level(name: str | None) -> Level | None:
    return Level.parse(name) if name else None


def place_job(
    placer: Placer,
    cluster: Cluster,
    spec: JobSpec,
    nodes: list[NodeDescription],
    exclude: Iterable[str] = (),
    feedback: FamilyWeights | None = None,
) -> list[PodPlacement] | Unfit:
    """Place the job's gang (``minMember`` pods) all together, or say why not. ``cluster`` is not changed.

    ``nodes`` describe the cluster (to judge whether the job could fit if it were empty);
    ``exclude`` are nodes this job may not use now (failed to start it, or earmarked for a gang);
    ``feedback`` is its family's weights from the feedback loop.
    """
    request = pod_request(spec, feedback, int(cluster.gpu_mem_cap.max()) if cluster.num_nodes else 0)
    gang = spec.spec.gang_size
    require, prefer = topology_levels(spec, feedback)
    exclude = set(exclude)
    if request.kind == "mig" or (gang == 1 and require is None and prefer is None):
        placed = _place_pods(placer, cordoned(cluster, exclude), request, gang, nodes)
        if isinstance(placed, Unfit) and (never := _never_fits(cluster, request)) is not None:
            return never
        return placed
    plan = place_gang(cluster, request, gang, require=require, prefer=prefer, exclude=exclude)
    if isinstance(plan, Unfit):
        if (never := _never_fits(cluster, request)) is not None:
            return never
        empty = place_gang(empty_cluster(nodes), request, gang, require=require, prefer=prefer)
        if isinstance(empty, Unfit):
            return Unfit(f"gang of {gang} x {describe(request)} can never fit: {empty.reason} when empty", False)
        return plan
    return [PodPlacement(i, a) for i, a in enumerate(plan.allocations)]


def _never_fits(cluster: Cluster, request: PodRequest) -> Unfit | None:
    """Why the request could not fit even on the empty cluster (not resolvable), or None. Asked only once a
    placement failed: a placement found says the request can fit, and most jobs are placed (a scan of the whole
    cluster saved per placed job)."""
    reason = never_fits(cluster, request)
    return None if reason is None else Unfit(reason, resolvable=False)


def missing_extras(record: JobRecord) -> list[int]:
    """The elastic extra pods (indices minMember..replicas-1) of a job that want placement: not placed,
    not running, not done."""
    body = record.spec.spec
    if body.replicas <= body.gang_size:  # not elastic: no extras (every cycle asks this of every running job)
        return []
    pods = {p.index: p for p in record.pods}
    out = []
    for i in range(body.gang_size, body.replicas):
        p = pods.get(i)
        if p is None or (p.node is None and p.state == PodState.PENDING):
            out.append(i)
    return out


def place_extras(
    placer: Placer,
    cluster: Cluster,
    spec: JobSpec,
    indices: Iterable[int],
    exclude: Iterable[str] = (),
    feedback: FamilyWeights | None = None,
) -> list[PodPlacement]:
    """Place as many of the elastic extra pods ``indices`` as fit, one at a time, on what ``cluster``
    leaves (not changed). Extras are single pods: the job already runs (or starts) on its gang."""
    request = pod_request(spec, feedback, int(cluster.gpu_mem_cap.max()) if cluster.num_nodes else 0)
    what_if = cordoned(cluster, set(exclude)).copy()
    out: list[PodPlacement] = []
    for index in indices:
        result = placer.place(what_if, request)
        if isinstance(result, Unfit):
            break
        what_if.allocate(result)
        out.append(PodPlacement(index, result))
    return out


def pod_name(job_id: str, index: int) -> str:
    return f"{job_id}-{index}"


def _place_pods(
    placer: Placer, cluster: Cluster, request: PodRequest, gang: int, nodes: list[NodeDescription]
) -> list[PodPlacement] | Unfit:
    if gang == 1:  # one pod: none placed before it to account for, so no what-if copy (``place`` changes nothing)
        result = placer.place(cluster, request)
        return result if isinstance(result, Unfit) else [PodPlacement(0, result)]
    what_if = cluster.copy()
    placements: list[PodPlacement] = []
    for index in range(gang):
        result = placer.place(what_if, request)
        if isinstance(result, Unfit):
            if gang > 1:
                capacity = gang_capacity(placer, empty_cluster(nodes).copy(), request, gang)
                if capacity < gang:
                    return Unfit(f"gang of {gang} x {describe(request)}: the whole cluster holds only {capacity}",
                                 False)
                return Unfit(f"{index}/{gang} pods of the gang fit now; waiting for capacity ({result.reason})")
            return result
        what_if.allocate(result)
        placements.append(PodPlacement(index, result))
    return placements


_EMPTY: dict[int, tuple[list[NodeDescription], Cluster]] = {}


def empty_cluster(nodes: list[NodeDescription]) -> Cluster:
    """The cluster of ``nodes`` with nothing on it, built once per node list (do not change it: copy it)."""
    cached = _EMPTY.get(id(nodes))
    if cached is None or cached[0] is not nodes:
        _EMPTY.clear()  # one node list is current at a time (the placer's view, a replay)
        cached = _EMPTY[id(nodes)] = (nodes, Cluster.from_descriptions(nodes))
    return cached[1]


def cordoned(cluster: Cluster, node_ids: set[str]) -> Cluster:
    """A what-if copy on which ``node_ids`` take no new pod (their free CPU is taken)."""
    if not node_ids:
        return cluster
    what_if = cluster.copy()
    for node_id in node_ids:
        i = what_if.index.get(node_id)
        if i is not None and what_if.cpu_free[i] > 0:
            what_if.allocate(Allocation(node_id=node_id, cpu_milli=int(what_if.cpu_free[i])))
    return what_if


def gang_capacity(placer: Placer, empty: Cluster, request: PodRequest, limit: int) -> int:
    """How many such pods the ``empty`` cluster holds (up to ``limit``); ``empty`` is used up."""
    for count in range(limit):
        result = placer.place(empty, request)
        if isinstance(result, Unfit):
            return count
        empty.allocate(result)
    return limit


def earmark(cluster: Cluster, spec: JobSpec) -> list[str]:
    """Nodes to keep for a blocked gang: the ones closest to free, until they could hold it all.

    The backfill rule: while a gang at the head of the queue waits, jobs behind it may not start
    on these nodes unless they are preemptible (best-effort), so the nodes drain and it can start.
    """
    request = pod_request(spec)
    per_pod = max(request.gpu_count * MILLI + request.gpu_milli, 1)
    need = spec.spec.gang_size * per_pod
    usable = cluster.gpu_exists.copy()
    if request.node_selector:
        labels = [all(lab.get(k) == v for k, v in request.node_selector) for lab in cluster.labels]
        usable &= np.array(labels)[:, None]
    capacity = np.where(usable, MILLI, 0).sum(axis=1)
    free = np.where(usable, cluster.milli_free, 0).sum(axis=1)
    chosen: list[str] = []
    held = 0
    for i in sorted(np.flatnonzero(capacity > 0), key=lambda i: (-free[i], cluster.node_ids[i])):
        chosen.append(cluster.node_ids[i])
        held += int(capacity[i]) // per_pod * per_pod
        if held >= need:
            break
    return chosen


GPU_UNITS = 7 * MILLI
"""Parts of a GPU in which every demand is whole (MIG slices are sevenths, shares thousandths): sums of
``demand_units`` are exact, the same in any order."""

_demand_memo: dict[int, tuple[weakref.ref[JobSpec], dict[str, float], tuple[int, int, int]]] = {}


def job_demand(spec: JobSpec) -> dict[str, float]:
    """What the whole gang holds, in the queues' units: GPUs (shares and MIG as fractions), mCPU, MiB.

    Every cycle asks it of every running and pending job, whose specs are parsed once and never changed
    in place: the answer is remembered per spec object while the spec lives (a weak reference, checked, so a
    reused id never hits, and the memo holds no spec alive: a finished job's spec goes with its record) and a
    fresh copy handed out."""
    return dict(_remembered(spec)[1])


def demand_units(spec: JobSpec) -> tuple[int, int, int]:
    """``job_demand`` as whole numbers: (GPUs in 1/``GPU_UNITS``, mCPU, MiB), remembered like it."""
    return _remembered(spec)[2]


def _remembered(spec: JobSpec) -> tuple[weakref.ref[JobSpec], dict[str, float], tuple[int, int, int]]:
    key = id(spec)
    memo = _demand_memo.get(key)
    if memo is not None and memo[0]() is spec:
        return memo
    units = _demand_units(spec)
    demand = {"gpu": units[0] / GPU_UNITS, "cpu": float(units[1]), "memory": float(units[2])}
    memo = _demand_memo[key] = (weakref.ref(spec, partial(_forget_demand, key)), demand, units)
    return memo


def _forget_demand(key: int, ref: weakref.ref[JobSpec]) -> None:
    """The spec behind ``key`` is gone: drop its entry (unless a newer spec at the same address took it)."""
    memo = _demand_memo.get(key)
    if memo is not None and memo[0] is ref:
        del _demand_memo[key]


def _demand_units(spec: JobSpec) -> tuple[int, int, int]:
    request = pod_request(spec)
    gang = spec.spec.gang_size
    if request.kind == "mig":
        sevenths = next((p.compute for t in PROFILES_BY_MODEL.values() for n, p in t.items()
                         if n == request.mig_profile), 7)
        gpu_units = sevenths * (GPU_UNITS // 7)
    else:
        gpu_units = request.gpu_count * GPU_UNITS + request.gpu_milli * (GPU_UNITS // MILLI)
    return gang * gpu_units, gang * request.cpu_milli, gang * request.memory_mib


def describe(request: PodRequest) -> str:
    if request.kind == "whole":
        return f"{request.gpu_count} GPU"
    if request.kind == "share":
        return f"{request.gpu_milli}m GPU share"
    if request.kind == "mig":
        return f"MIG {request.mig_profile}"
    return f"{request.cpu_milli}m CPU"


def claim_items(alloc: Allocation, gpu_models: dict[int, str]) -> list[tuple[str, str, int]]:
    """The (node, field, amount) items that hold ``alloc`` in Redis (see tide.store.claims)."""
    node = alloc.node_id
    items = [(node, "cpu", alloc.cpu_milli), (node, "mem", alloc.memory_mib)]
    for index, milli, mem in zip(alloc.gpu_indices, alloc.gpu_milli, alloc.gpu_mem_mib, strict=True):
        items.append((node, f"g{index}.milli", milli))
        items.append((node, f"g{index}.mem", mem))
    if alloc.mig is not None:
        profile = profiles_for(gpu_models[alloc.mig.gpu_index])[alloc.mig.profile]
        items.append((node, f"g{alloc.mig.gpu_index}.milli", profile.compute * MIG_SLICE_MILLI))
        for slot in range(alloc.mig.start, alloc.mig.start + profile.size):
            items.append((node, f"g{alloc.mig.gpu_index}.slot{slot}", 1))
    return items
