"""Pure computations behind the cluster gauges: allocation by kind, fragmentation against the pending
demand, queue lengths, lent/borrowed capacity. The service reads Redis and feeds these functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tide.core.mig import MIG_COMPUTE_SLICES, profiles_for
from tide.schemas.job import JobSpec
from tide.schemas.node import NodeDescription

MILLI = 1000
KINDS = ("whole", "shared", "mig")
DEFAULT_POOL = "default"


def pool_of(node: NodeDescription) -> str:
    return node.labels.get("pool") or DEFAULT_POOL


# ------------------------------------------------------------------ allocation
@dataclass
class Allocated:
    """GPUs (in GPU units; a share counts its milli / 1000, a MIG instance its compute slices / 7) per kind."""

    gpus: int = 0
    by_kind: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))

    def ratio(self, kind: str) -> float:
        if not self.gpus:
            return 0.0
        amount = sum(self.by_kind.values()) if kind == "all" else self.by_kind[kind]
        return min(1.0, amount / self.gpus)


def allocation_of(alloc: Mapping[str, Any], gpu_models: Mapping[int, str]) -> dict[str, float]:
    """GPU units of one claim (the core's ``Allocation.to_dict``), by kind."""
    out = dict.fromkeys(KINDS, 0.0)
    mig = alloc.get("mig")
    if mig:
        profile = profiles_for(gpu_models.get(int(mig["gpu_index"]), "")).get(mig["profile"])
        out["mig"] += (profile.compute if profile else 1) / MIG_COMPUTE_SLICES
    for milli in alloc.get("gpu_milli") or ():
        if int(milli) >= MILLI:
            out["whole"] += 1.0
        else:
            out["shared"] += int(milli) / MILLI
    return out


def allocation_by_node(
    nodes: Mapping[str, NodeDescription], claims: Iterable[Mapping[str, Any]]
) -> dict[str, Allocated]:
    out = {node_id: Allocated(gpus=len(n.gpus)) for node_id, n in nodes.items()}
    for alloc in claims:
        node = nodes.get(alloc.get("node_id", ""))
        if node is None:
            continue
        models = {g.index: g.model for g in node.gpus}
        for kind, amount in allocation_of(alloc, models).items():
            out[node.node_id].by_kind[kind] += amount
    return out


def rollup(per_node: Mapping[str, Allocated], group: Mapping[str, str]) -> dict[str, Allocated]:
    """Sum nodes into groups (``group``: node -> pool); the cluster is ``rollup(per_node, {n: '' ...})``."""
    out: dict[str, Allocated] = {}
    for node_id, a in per_node.items():
        g = out.setdefault(group.get(node_id, DEFAULT_POOL), Allocated())
        g.gpus += a.gpus
        for kind, amount in a.by_kind.items():
            g.by_kind[kind] += amount
    return out


# ------------------------------------------------------------------ fragmentation
@dataclass(frozen=True)
class FreeGpu:
    node: str
    index: int
    model: str
    milli_free: int
    mem_free_mib: int
    whole_free: bool  # nothing of it is claimed


@dataclass(frozen=True)
class Demand:
    """One pending pod's GPU request, reduced to what decides whether a free GPU can serve it."""

    kind: str  # whole | shared | mig
    gpus: int = 1
    milli: int = MILLI
    mem_mib: int = 0
    models: tuple[str, ...] = ()
    selector: tuple[tuple[str, str], ...] = ()


def demand_of(spec: JobSpec) -> Demand | None:
    r = spec.spec.template.resources
    sel = tuple(sorted(spec.spec.template.node_selector.items()))
    models = tuple(r.gpu_model)
    if r.gpu > 0:
        return Demand("whole", gpus=r.gpu, models=models, selector=sel)
    if r.gpu_share is not None:
        return Demand("shared", milli=r.gpu_share.sm_percent * 10, mem_mib=r.gpu_share.memory_mib, models=models,
                      selector=sel)
    if r.mig is not None:
        return Demand("mig", milli=0, mem_mib=0, models=(r.mig,), selector=sel)
    return None


def free_gpus(node: NodeDescription, cap: Mapping[str, int | str], used: Mapping[str, int | str]) -> list[FreeGpu]:
    """Per-GPU free capacity from the ``tide:cap:<node>`` / ``tide:used:<node>`` hashes. The used hash is read in
    one pass: it keeps every field a claim ever touched (about 80 on an 8-GPU MIG-capable node: ``g<i>.milli``,
    ``g<i>.mem``, ``g<i>.slot<k>``), so searching it whole for each GPU's slots cost its square."""
    uses = gpu_fields(used, {f"g{g.index}": g.index for g in node.gpus})
    out = []
    for g in node.gpus:
        u = uses.get(g.index, {})
        milli_used, mem_used = u.get("milli", 0), u.get("mem", 0)
        slots_used = any(v for field, v in u.items() if field.startswith("slot"))
        milli_cap, mem_cap = int(cap.get(f"g{g.index}.milli", MILLI)), int(cap.get(f"g{g.index}.mem", g.memory_mib))
        out.append(FreeGpu(node.node_id, g.index, g.model, max(0, milli_cap - milli_used), max(0, mem_cap - mem_used),
                           milli_used == 0 and mem_used == 0 and not slots_used))
    return out


def gpu_fields(fields: Mapping[str, int | str], index_of: Mapping[str, int]) -> dict[int, dict[str, int]]:
    """The GPU fields of a used (or capacity) hash by GPU index: ``{"g3.mem": "10"}`` -> ``{3: {"mem": 10}}``, for
    the GPUs ``index_of`` names (``"g3"`` -> 3) and the fields a claim writes (``milli``, ``mem``, ``slot<k>``);
    ``cpu``, ``mem`` and anything else left out."""
    out: dict[int, dict[str, int]] = {}
    for key, value in fields.items():
        gpu, dot, field = key.partition(".")
        index = index_of.get(gpu) if dot else None
        if index is not None and (field in ("milli", "mem") or field.startswith("slot")):
            out.setdefault(index, {})[field] = int(value)
    return out


def _serves(gpu: FreeGpu, d: Demand, labels: Mapping[str, str], whole_free_on_node: int) -> bool:
    if any(labels.get(k) != v for k, v in d.selector):
        return False
    if d.kind == "mig":
        profile = profiles_for(gpu.model).get(d.models[0]) if d.models else None
        return profile is not None and gpu.milli_free * MIG_COMPUTE_SLICES >= profile.compute * MILLI
    if d.models and gpu.model not in d.models:
        return False
    if d.kind == "whole":
        return gpu.whole_free and whole_free_on_node >= d.gpus
    return gpu.milli_free >= d.milli and gpu.mem_free_mib >= d.mem_mib


@dataclass
class Fragmentation:
    free_gpus: float = 0.0  # free GPU units (milli free / 1000) summed over GPUs
    fragmented_gpus: float = 0.0  # of which no pending pod could use

    @property
    def ratio(self) -> float:
        return self.fragmented_gpus / self.free_gpus if self.free_gpus > 0 else 0.0


def fragmentation(
    nodes: Mapping[str, NodeDescription], free: Mapping[str, list[FreeGpu]], demand: Iterable[Demand]
) -> dict[str, Fragmentation]:
    """Per pool: free GPU capacity, and the part of it no pending pod could use (0 with no pending demand).

    A free GPU fraction counts as usable when at least one pending pod's request fits on that GPU as it
    is now (a whole-GPU pod needs that many wholly free GPUs on the node, a share needs the SMs and the
    memory, a MIG pod the profile's compute slices). Capacity is fragmented when nothing waiting fits it.
    """
    demand = list(dict.fromkeys(demand))
    out: dict[str, Fragmentation] = {}
    for node_id, node in nodes.items():
        f = out.setdefault(pool_of(node), Fragmentation())
        gpus = free.get(node_id, [])
        whole_free = sum(1 for g in gpus if g.whole_free)
        for g in gpus:
            units = g.milli_free / MILLI
            if units <= 0:
                continue
            f.free_gpus += units
            if demand and not any(_serves(g, d, node.labels, whole_free) for d in demand):
                f.fragmented_gpus += units
    return out


# ------------------------------------------------------------------ queues
def pending_counts(specs: Iterable[JobSpec]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for s in specs:
        key = (s.metadata.queue, s.metadata.priority_class.value)
        out[key] = out.get(key, 0) + 1
    return out


def gpu_units(alloc: Mapping[str, Any], gpu_models: Mapping[int, str]) -> float:
    return sum(allocation_of(alloc, gpu_models).values())


def pool_lending(held: Iterable[tuple[str, str | None, float]]) -> dict[str, tuple[float, float]]:
    """Pool -> (lent, borrowed) GPUs under tidal lending (``tide.core.tides``): ``held`` is
    (node's pool, the job's ``nodeSelector`` pool or None, GPU units) per claim. A job selecting pool Q
    on a node of pool P != Q: P lends, Q borrows. Jobs without a pool selector borrow nothing."""
    out: dict[str, list[float]] = {}
    for node_pool, job_pool, units in held:
        out.setdefault(node_pool, [0.0, 0.0])
        if job_pool is None or job_pool == node_pool:
            continue
        out[node_pool][0] += units
        out.setdefault(job_pool, [0.0, 0.0])[1] += units
    return {p: (v[0], v[1]) for p, v in out.items()}


def load_guarantees(config: Mapping[str, Any] | None) -> dict[str, float]:
    """Queue path -> guaranteed GPUs, from the queue tree config ``{"queues": [{"name", "guarantee", "children"}]}``."""
    out: dict[str, float] = {}

    def walk(items: Iterable[Mapping[str, Any]], parent: str) -> None:
        for item in items:
            path = f"{parent}/{item['name']}" if parent else str(item["name"])
            out[path] = float((item.get("guarantee") or {}).get("gpu", 0.0))
            walk(item.get("children") or [], path)

    walk((config or {}).get("queues") or [], "")
    return out


def lent_borrowed(
    usage: Mapping[str, float], guarantees: Mapping[str, float]
) -> dict[str, tuple[float, float]]:
    """Queue -> (lent, borrowed) GPUs, among top-level queues (tidal capacity).

    A queue borrows what it uses beyond its guarantee (all of its use without one). The guaranteed
    capacity other queues leave unused is what they lend: the borrowed total is attributed to the
    lenders in proportion to their unused guarantee (never more than it). ``usage`` is per job queue;
    it is counted up to the top-level queue of its path.
    """
    top: dict[str, float] = {}
    for queue, used in usage.items():
        root = queue.split("/", 1)[0]
        top[root] = top.get(root, 0.0) + used
    for path in guarantees:
        if "/" not in path:
            top.setdefault(path, 0.0)
    borrowed = {q: max(0.0, u - guarantees.get(q, 0.0)) for q, u in top.items()}
    unused = {q: max(0.0, guarantees.get(q, 0.0) - u) for q, u in top.items()}
    total_b, total_u = sum(borrowed.values()), sum(unused.values())
    scale = min(1.0, total_b / total_u) if total_u > 0 else 0.0
    return {q: (unused[q] * scale, borrowed[q]) for q in top}


# ------------------------------------------------------------------ GPU telemetry
MAX_SM_CLOCK_HZ = {"H100-80GB": 1.98e9, "H200-141GB": 1.98e9, "A100-80GB": 1.41e9, "A100-40GB": 1.41e9,
                   "L40S": 2.52e9, "V100M16": 1.53e9, "V100M32": 1.53e9, "T4": 1.59e9}


def sm_efficiency(utilization: float, sm_clock_hz: float, model: str, seen_max_hz: float = 0.0) -> float:
    """Useful SM throughput as a share of the GPU's best: utilisation x SM clock / its maximum clock.

    NVML has no SM-efficiency counter (DCGM's SM activity would be the real thing); a busy GPU that is
    clocked down (power or thermal capping) does proportionally less work, which this shows.
    """
    top = max(MAX_SM_CLOCK_HZ.get(model, 0.0), seen_max_hz, sm_clock_hz)
    return max(0.0, min(1.0, utilization * (sm_clock_hz / top if top > 0 else 0.0)))


# ------------------------------------------------------------------ GPU holders
@dataclass(frozen=True)
class Holder:
    """A pod holding (part of) a GPU: a whole GPU, a share of it, or a MIG instance on it."""

    job: str
    pod: str
    queue: str


def gpu_holders(claims: Iterable[tuple[Holder, Mapping[str, Any]]]) -> dict[tuple[str, int], tuple[Holder, ...]]:
    """(node, GPU index) -> the pods holding it, from the claims (``Allocation.to_dict``): whole GPUs and
    shares by ``gpu_indices``, a MIG instance by its parent GPU. Sorted by job and pod."""
    out: dict[tuple[str, int], set[Holder]] = {}
    for holder, alloc in claims:
        node = str(alloc.get("node_id", ""))
        indices = {int(i) for i in alloc.get("gpu_indices") or ()}
        mig = alloc.get("mig")
        if mig:
            indices.add(int(mig["gpu_index"]))
        for i in indices:
            out.setdefault((node, i), set()).add(holder)
    return {k: tuple(sorted(v, key=lambda h: (h.job, h.pod))) for k, v in out.items()}
