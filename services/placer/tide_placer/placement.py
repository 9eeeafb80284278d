"""The placer's one placement boundary: a job spec and a cluster view in, pod placements out.

Interim best-fit over whole GPUs and shares; the placement core (``tide.core``) replaces
the body of ``place_job`` without changing its contract.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from tide.schemas.job import JobSpec, Resources
from tide.schemas.node import NodeDescription


@dataclass
class GpuView:
    index: int
    uuid: str
    model: str
    memory_mib: int
    free_milli: int
    free_mem: int


@dataclass
class NodeView:
    desc: NodeDescription
    free_cpu: int
    free_mem: int
    gpus: list[GpuView] = field(default_factory=list)


@dataclass(frozen=True)
class GpuTake:
    index: int
    uuid: str
    milli: int
    memory_mib: int


@dataclass(frozen=True)
class PodPlacement:
    pod_index: int
    node_id: str
    gpus: tuple[GpuTake, ...]
    cpu_milli: int
    memory_mib: int

    def claim_items(self) -> list[tuple[str, str, int]]:
        items = [(self.node_id, "cpu", self.cpu_milli), (self.node_id, "mem", self.memory_mib)]
        for g in self.gpus:
            items.append((self.node_id, f"g{g.index}.milli", g.milli))
            items.append((self.node_id, f"g{g.index}.mem", g.memory_mib))
        return items


@dataclass(frozen=True)
class Unfit:
    reason: str
    resolvable: bool  # False: can never fit on this cluster, even empty


def build_view(nodes: list[NodeDescription], used: dict[str, dict[str, int]]) -> dict[str, NodeView]:
    view: dict[str, NodeView] = {}
    for node in nodes:
        u = used.get(node.node_id, {})
        view[node.node_id] = NodeView(
            desc=node,
            free_cpu=node.cpu_milli - u.get("cpu", 0),
            free_mem=node.memory_mib - u.get("mem", 0),
            gpus=[
                GpuView(
                    index=g.index,
                    uuid=g.uuid or f"GPU-{node.node_id}-{g.index}",
                    model=g.model,
                    memory_mib=g.memory_mib,
                    free_milli=1000 - u.get(f"g{g.index}.milli", 0),
                    free_mem=g.memory_mib - u.get(f"g{g.index}.mem", 0),
                )
                for g in sorted(node.gpus, key=lambda g: g.index)
            ],
        )
    return view


def _model_ok(gpu_model: str, allowed: list[str]) -> bool:
    return not allowed or any(gpu_model == m or gpu_model.startswith(m) for m in allowed)


def _selector_ok(node: NodeDescription, selector: dict[str, str]) -> bool:
    return all(node.labels.get(k) == v for k, v in selector.items())


def _take_on_node(node: NodeView, res: Resources) -> tuple[GpuTake, ...] | None:
    gpus = [g for g in node.gpus if _model_ok(g.model, res.gpu_model)]
    if res.gpu > 0:
        free = [g for g in gpus if g.free_milli == 1000 and g.free_mem == g.memory_mib]
        if len(free) < res.gpu:
            return None
        return tuple(GpuTake(g.index, g.uuid, 1000, g.memory_mib) for g in free[: res.gpu])
    if res.gpu_share is not None:
        milli = res.gpu_share.sm_percent * 10
        fits = [g for g in gpus if g.free_milli >= milli and g.free_mem >= res.gpu_share.memory_mib]
        if not fits:
            return None
        best = min(fits, key=lambda g: (g.free_milli, g.index))  # best fit: fullest GPU that fits
        return (GpuTake(best.index, best.uuid, milli, res.gpu_share.memory_mib),)
    return ()


def never_fits(nodes: list[NodeDescription], spec: JobSpec) -> str | None:
    """Why the job can never be placed on this cluster even when it is empty, or None."""
    tmpl = spec.spec.template
    res = tmpl.resources
    if res.mig is not None:
        return "MIG requests need the placement core (not enabled in this placer)"
    matching = [n for n in nodes if _selector_ok(n, tmpl.node_selector)]
    if not matching:
        sel = ",".join(f"{k}={v}" for k, v in tmpl.node_selector.items())
        return f"no node matches nodeSelector {sel} (0/{len(nodes)} nodes)"
    big = [n for n in matching if n.cpu_milli >= res.cpu_milli and n.memory_mib >= res.memory_mib]
    if not big:
        return f"no node has {res.cpu_milli} mCPU and {res.memory_mib} MiB memory"
    if res.gpu > 0:
        per_node = [sum(1 for g in n.gpus if _model_ok(g.model, res.gpu_model)) for n in big]
        if max(per_node) < res.gpu:
            return f"needs {res.gpu} GPUs on one node; the largest matching node has {max(per_node)}"
        total = sum(c // res.gpu for c in per_node)
        if total < spec.spec.gang_size:
            return f"gang of {spec.spec.gang_size} pods x {res.gpu} GPUs; the matching nodes hold only {total} such pods"
    if res.gpu_share is not None:
        mem = max((g.memory_mib for n in big for g in n.gpus if _model_ok(g.model, res.gpu_model)), default=0)
        if mem < res.gpu_share.memory_mib:
            return f"share needs {res.gpu_share.memory_mib} MiB GPU memory; the largest matching GPU has {mem}"
    return None


def place_job(view: dict[str, NodeView], spec: JobSpec) -> list[PodPlacement] | Unfit:
    """Place the job's gang (``minMember`` pods) all together, or return why not."""
    reason = never_fits([v.desc for v in view.values()], spec)
    if reason is not None:
        return Unfit(reason, resolvable=False)
    tmpl = spec.spec.template
    res = tmpl.resources
    scratch = copy.deepcopy(view)
    placements: list[PodPlacement] = []
    for pod_index in range(spec.spec.gang_size):
        best: tuple[tuple[int, int, str], NodeView, tuple[GpuTake, ...]] | None = None
        for node in scratch.values():
            if not _selector_ok(node.desc, tmpl.node_selector):
                continue
            if node.free_cpu < res.cpu_milli or node.free_mem < res.memory_mib:
                continue
            take = _take_on_node(node, res)
            if take is None:
                continue
            free_after = sum(g.free_milli for g in node.gpus) - sum(t.milli for t in take)
            score = (free_after, node.free_cpu - res.cpu_milli, node.desc.node_id)  # best fit
            if best is None or score < best[0]:
                best = (score, node, take)
        if best is None:
            placed = len(placements)
            return Unfit(f"only {placed}/{spec.spec.gang_size} pods fit in the free capacity now", True)
        _, node, take = best
        node.free_cpu -= res.cpu_milli
        node.free_mem -= res.memory_mib
        for t in take:
            gpu = node.gpus[t.index]
            gpu.free_milli -= t.milli
            gpu.free_mem -= t.memory_mib
        placements.append(PodPlacement(pod_index, node.desc.node_id, take, res.cpu_milli, res.memory_mib))
    return placements
