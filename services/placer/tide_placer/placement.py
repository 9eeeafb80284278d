"""The placer's one placement boundary: a job spec and the cluster in, pod allocations out.

The decisions are the placement core's (``tide.core``); this module only turns a job into
pod requests, places the gang all-or-nothing on a what-if copy, and turns allocations into
the Redis claim items that make them stick.
"""

from __future__ import annotations

from dataclasses import dataclass

from tide.core import MILLI, Allocation, Cluster, Placer, PodRequest, Unfit, never_fits, profiles_for
from tide.schemas.job import JobSpec
from tide.schemas.node import NodeDescription

MIG_SLICE_MILLI = MILLI // 7  # a MIG compute slice in milli-GPU, so a whole-GPU claim cannot overlap MIG


@dataclass(frozen=True)
class PodPlacement:
    pod_index: int
    alloc: Allocation


def pod_request(spec: JobSpec) -> PodRequest:
    tmpl = spec.spec.template
    return PodRequest.from_resources(tmpl.resources, tmpl.node_selector)


def place_job(
    placer: Placer, cluster: Cluster, spec: JobSpec, nodes: list[NodeDescription]
) -> list[PodPlacement] | Unfit:
    """Place the job's gang (``minMember`` pods) all together, or return why not. ``cluster`` is not changed.

    ``nodes`` describe the cluster; they are used to judge whether the gang could fit if it were empty.
    """
    request = pod_request(spec)
    gang = spec.spec.gang_size
    reason = never_fits(cluster, request)
    if reason is not None:
        return Unfit(reason, resolvable=False)
    what_if = cluster.copy()
    placements: list[PodPlacement] = []
    for index in range(gang):
        result = placer.place(what_if, request)
        if isinstance(result, Unfit):
            if gang > 1:
                capacity = gang_capacity(placer, Cluster.from_descriptions(nodes), request, gang)
                if capacity < gang:
                    return Unfit(
                        f"gang of {gang} pods x {describe(request)}: the whole cluster holds only {capacity}",
                        resolvable=False,
                    )
                return Unfit(f"{index}/{gang} pods of the gang fit now; waiting for capacity ({result.reason})")
            return result
        what_if.allocate(result)
        placements.append(PodPlacement(index, result))
    return placements


def gang_capacity(placer: Placer, empty: Cluster, request: PodRequest, limit: int) -> int:
    """How many such pods the ``empty`` cluster holds (up to ``limit``); ``empty`` is used up."""
    for count in range(limit):
        result = placer.place(empty, request)
        if isinstance(result, Unfit):
            return count
        empty.allocate(result)
    return limit


def describe(request: PodRequest) -> str:
    if request.kind == "whole":
        return f"{request.gpu_count} GPUs"
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
