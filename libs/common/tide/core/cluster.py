"""The cluster model: nodes, GPUs, MIG instances and topology as numpy arrays (no I/O).

Per-node arrays have shape ``[N]``; per-GPU arrays ``[N, G]`` where ``G`` is the largest GPU count
of any node (padding GPUs do not exist: ``gpu_exists`` is False, free milli 0, model -1).

Accounting per GPU:
- ``milli_free`` (0..1000) and ``gpu_mem_free`` (MiB) serve whole GPUs and shares; a whole GPU needs
  both at capacity, a share takes some of each and neither may go negative.
- A GPU in MIG mode has ``milli_free = gpu_mem_free = 0`` (it serves MIG instances only); its
  configured instances live in ``mig_instances[(node, gpu)] = {(profile, start): used}``.
"""

from __future__ import annotations

import copy as _copy
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tide.core.mig import MIG_COMPUTE_SLICES, profiles_for
from tide.core.model import MILLI, Allocation, MigAssignment, OversubscriptionError
from tide.core.topology import GpuPosition

if TYPE_CHECKING:  # pragma: no cover
    from tide.schemas.node import NodeDescription


_STAMPS = itertools.count(1)  # node stamps, unique across every cluster and copy in the process


IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def slot_mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


class Cluster:
    """Mutable, array-backed cluster state shared by the live placer and the simulator.

    Change the state only through ``allocate`` and ``release``: they stamp the node (``node_stamp``),
    which is how the placer's score cache knows what changed.
    """

    # set by from_descriptions (annotations only: no class attributes)
    cpu_cap: IntArray  # [N]
    mem_cap: IntArray
    cpu_free: IntArray
    mem_free: IntArray
    ngpu: IntArray
    node_model: IntArray
    node_stamp: IntArray
    gpu_exists: BoolArray  # [N, G]
    gpu_model: IntArray
    gpu_mem_cap: IntArray
    mig_capable: BoolArray
    mig_enabled: BoolArray
    mig_described: BoolArray
    pcie: IntArray
    numa: IntArray
    nvlink: IntArray
    milli_free: IntArray
    gpu_mem_free: IntArray
    _label_cache: dict[str, BoolArray]

    def __init__(self) -> None:
        self.node_ids: list[str] = []
        self.index: dict[str, int] = {}
        self.models: list[str] = []
        self.labels: list[dict[str, str]] = []
        self.racks: list[str] = []
        self.spines: list[str] = []
        self.version = 0
        self.mig_instances: dict[tuple[int, int], dict[tuple[str, int], bool]] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_descriptions(cls, nodes: Iterable[NodeDescription]) -> Cluster:
        nodes = list(nodes)
        c = cls()
        n = len(nodes)
        g = max([len(nd.gpus) for nd in nodes] + [1])
        c.node_ids = [nd.node_id for nd in nodes]
        if len(set(c.node_ids)) != n:
            raise ValueError("node ids must be unique")
        c.index = {nid: i for i, nid in enumerate(c.node_ids)}
        c.labels = [dict(nd.labels) for nd in nodes]
        c.racks = [nd.rack for nd in nodes]
        c.spines = [nd.spine for nd in nodes]
        c.cpu_cap = np.array([nd.cpu_milli for nd in nodes], dtype=np.int64)
        c.mem_cap = np.array([nd.memory_mib for nd in nodes], dtype=np.int64)
        c.cpu_free = c.cpu_cap.copy()
        c.mem_free = c.mem_cap.copy()
        c.ngpu = np.array([len(nd.gpus) for nd in nodes], dtype=np.int64)
        c.gpu_exists = np.zeros((n, g), dtype=bool)
        c.gpu_model = np.full((n, g), -1, dtype=np.int64)
        c.gpu_mem_cap = np.zeros((n, g), dtype=np.int64)
        c.mig_capable = np.zeros((n, g), dtype=bool)
        c.mig_enabled = np.zeros((n, g), dtype=bool)
        c.pcie = np.zeros((n, g), dtype=np.int64)
        c.numa = np.zeros((n, g), dtype=np.int64)
        c.nvlink = np.full((n, g), -1, dtype=np.int64)
        model_ids: dict[str, int] = {}
        for i, nd in enumerate(nodes):
            for gpu in nd.gpus:
                j = gpu.index
                c.gpu_exists[i, j] = True
                c.gpu_model[i, j] = model_ids.setdefault(gpu.model, len(model_ids))
                c.gpu_mem_cap[i, j] = gpu.memory_mib
                c.mig_capable[i, j] = gpu.mig_capable and bool(profiles_for(gpu.model))
                c.pcie[i, j] = gpu.pcie_switch
                c.numa[i, j] = gpu.numa_node
                c.nvlink[i, j] = -1 if gpu.nvlink_domain is None else gpu.nvlink_domain
                if gpu.mig_enabled:
                    c.mig_enabled[i, j] = True
                    table = profiles_for(gpu.model)
                    inst: dict[tuple[str, int], bool] = {}
                    for mi in gpu.mig_instances:
                        if mi.profile not in table:
                            raise ValueError(f"{nd.node_id} gpu {j}: profile {mi.profile} not valid for {gpu.model}")
                        inst[(mi.profile, mi.start)] = False
                    c.mig_instances[(i, j)] = inst
        c.models = list(model_ids)
        c.mig_described = c.mig_enabled.copy()  # GPUs the node reports in MIG mode stay in it
        c.node_model = np.where(c.ngpu > 0, c.gpu_model[:, 0], -1)
        c.milli_free = np.where(c.gpu_exists & ~c.mig_enabled, MILLI, 0).astype(np.int64)
        c.gpu_mem_free = np.where(c.mig_enabled, 0, c.gpu_mem_cap)
        # per node: 0 in the described state, then a process-unique stamp at every allocate/release, so
        # two clusters (e.g. a what-if copy) with the same stamp on a node hold the same state there
        c.node_stamp = np.zeros(n, dtype=np.int64)
        c._label_cache = {}
        return c

    def copy(self) -> Cluster:
        """An independent copy for what-if evaluation (arrays copied, no description objects)."""
        new = _copy.copy(self)
        for name, value in self.__dict__.items():
            if isinstance(value, np.ndarray) and name not in _STATIC_ARRAYS:
                setattr(new, name, value.copy())
        new.mig_instances = {k: dict(v) for k, v in self.mig_instances.items()}
        return new

    # ------------------------------------------------------------------ queries
    @property
    def num_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.gpu_exists.sum()) * MILLI

    def allocated_gpu_milli(self) -> int:
        """milli-GPU in use by whole GPUs and shares (GPUs in MIG mode excluded)."""
        usable = self.gpu_exists & ~self.mig_enabled
        return int((MILLI - self.milli_free)[usable].sum())

    def mig_used_milli(self) -> int:
        total = 0
        for (i, j), inst in self.mig_instances.items():
            table = profiles_for(self.models[self.gpu_model[i, j]])
            total += sum(table[p].compute for (p, _), used in inst.items() if used)
        return total * MILLI // MIG_COMPUTE_SLICES

    def label_values(self, key: str) -> np.ndarray:
        arr = self._label_cache.get(key)
        if arr is None:
            arr = np.array([lab.get(key) for lab in self.labels], dtype=object)
            self._label_cache[key] = arr
        return arr

    def model_id(self, model: str) -> int:
        try:
            return self.models.index(model)
        except ValueError:
            return -2

    def position(self, node: int, gpu: int | None = None) -> GpuPosition:
        if gpu is None:
            return GpuPosition(self.spines[node], self.racks[node], self.node_ids[node], -1, -1, None)
        nv = int(self.nvlink[node, gpu])
        return GpuPosition(
            self.spines[node],
            self.racks[node],
            self.node_ids[node],
            int(self.numa[node, gpu]),
            int(self.pcie[node, gpu]),
            None if nv < 0 else nv,
        )

    def mig_slots_used(self, node: int, gpu: int) -> tuple[int, int]:
        """(memory-slot bitmask, compute slices) of the configured instances on one GPU."""
        inst = self.mig_instances.get((node, gpu), {})
        table = profiles_for(self.models[self.gpu_model[node, gpu]])
        mask = compute = 0
        for p, s in inst:
            mask |= slot_mask(s, table[p].size)
            compute += table[p].compute
        return mask, compute

    # ------------------------------------------------------------------ mutation
    def allocate(self, alloc: Allocation) -> None:
        """Apply an allocation; raises OversubscriptionError (and changes nothing) if it does not fit."""
        i = self._node(alloc.node_id)
        self._check(i, alloc)
        self.cpu_free[i] -= alloc.cpu_milli
        self.mem_free[i] -= alloc.memory_mib
        for j, m, mem in zip(alloc.gpu_indices, alloc.gpu_milli, alloc.gpu_mem_mib, strict=True):
            self.milli_free[i, j] -= m
            self.gpu_mem_free[i, j] -= mem
        if alloc.mig is not None:
            self._mig_take(i, alloc.mig)
        self.version += 1
        self.node_stamp[i] = next(_STAMPS)

    def release(self, alloc: Allocation) -> None:
        """Exactly undo ``allocate(alloc)``."""
        i = self._node(alloc.node_id)
        cpu = self.cpu_free[i] + alloc.cpu_milli
        mem = self.mem_free[i] + alloc.memory_mib
        if cpu > self.cpu_cap[i] or mem > self.mem_cap[i]:
            raise OversubscriptionError(f"release of an allocation not held on {alloc.node_id} (cpu/memory)")
        for j, m, gm in zip(alloc.gpu_indices, alloc.gpu_milli, alloc.gpu_mem_mib, strict=True):
            if self.milli_free[i, j] + m > MILLI or self.gpu_mem_free[i, j] + gm > self.gpu_mem_cap[i, j]:
                raise OversubscriptionError(f"release of an allocation not held on {alloc.node_id} gpu {j}")
        if alloc.mig is not None:
            inst = self.mig_instances.get((i, alloc.mig.gpu_index), {})
            if not inst.get((alloc.mig.profile, alloc.mig.start), False):
                raise OversubscriptionError(f"release of a MIG instance not held on {alloc.node_id}")
        self.cpu_free[i] = cpu
        self.mem_free[i] = mem
        for j, m, gm in zip(alloc.gpu_indices, alloc.gpu_milli, alloc.gpu_mem_mib, strict=True):
            self.milli_free[i, j] += m
            self.gpu_mem_free[i, j] += gm
        if alloc.mig is not None:
            self._mig_give_back(i, alloc.mig)
        self.version += 1
        self.node_stamp[i] = next(_STAMPS)

    def _node(self, node_id: str) -> int:
        try:
            return self.index[node_id]
        except KeyError:
            raise OversubscriptionError(f"unknown node {node_id!r}") from None

    def _check(self, i: int, alloc: Allocation) -> None:
        nid = alloc.node_id
        if alloc.cpu_milli < 0 or alloc.memory_mib < 0:
            raise OversubscriptionError("negative allocation")
        if alloc.cpu_milli > self.cpu_free[i]:
            raise OversubscriptionError(f"{nid}: cpu {alloc.cpu_milli}m > free {self.cpu_free[i]}m")
        if alloc.memory_mib > self.mem_free[i]:
            raise OversubscriptionError(f"{nid}: memory {alloc.memory_mib}MiB > free {self.mem_free[i]}MiB")
        if len(set(alloc.gpu_indices)) != len(alloc.gpu_indices):
            raise OversubscriptionError(f"{nid}: duplicate gpu index in {alloc.gpu_indices}")
        for j, m, mem in zip(alloc.gpu_indices, alloc.gpu_milli, alloc.gpu_mem_mib, strict=True):
            if not (0 <= j < self.ngpu[i]):
                raise OversubscriptionError(f"{nid}: no gpu {j}")
            if self.mig_enabled[i, j]:
                raise OversubscriptionError(f"{nid}: gpu {j} is in MIG mode")
            if m <= 0 or m > MILLI or mem < 0:
                raise OversubscriptionError(f"{nid}: bad gpu share {m}m/{mem}MiB")
            if m > self.milli_free[i, j]:
                raise OversubscriptionError(f"{nid}: gpu {j} milli {m} > free {self.milli_free[i, j]}")
            if mem > self.gpu_mem_free[i, j]:
                raise OversubscriptionError(f"{nid}: gpu {j} memory {mem}MiB > free {self.gpu_mem_free[i, j]}MiB")
        if alloc.mig is not None:
            self._mig_check(i, alloc.mig)

    def _mig_check(self, i: int, mig: MigAssignment) -> None:
        nid, j = self.node_ids[i], mig.gpu_index
        if not (0 <= j < self.ngpu[i]) or not self.mig_capable[i, j]:
            raise OversubscriptionError(f"{nid}: gpu {j} is not MIG-capable")
        table = profiles_for(self.models[self.gpu_model[i, j]])
        if mig.profile not in table:
            raise OversubscriptionError(f"{nid}: profile {mig.profile} not valid for gpu {j}")
        prof = table[mig.profile]
        inst = self.mig_instances.get((i, j), {})
        key = (mig.profile, mig.start)
        if not mig.repartition:
            if key not in inst or inst[key]:
                raise OversubscriptionError(f"{nid}: gpu {j} has no idle {mig.profile}@{mig.start} instance")
            return
        if mig.start not in prof.starts:
            raise OversubscriptionError(f"{nid}: {mig.profile} cannot start at slot {mig.start}")
        if not self.mig_enabled[i, j]:
            idle = self.milli_free[i, j] == MILLI and self.gpu_mem_free[i, j] == self.gpu_mem_cap[i, j]
            if not mig.enables_mig or not idle:
                raise OversubscriptionError(f"{nid}: gpu {j} is busy; cannot switch it to MIG mode")
        elif mig.enables_mig:
            raise OversubscriptionError(f"{nid}: gpu {j} is already in MIG mode")
        remaining = dict(inst)
        for d in mig.destroyed:
            if d not in remaining or remaining[d]:
                raise OversubscriptionError(f"{nid}: gpu {j} cannot destroy {d}: missing or in use")
            del remaining[d]
        if key in remaining:
            raise OversubscriptionError(f"{nid}: gpu {j} already has {mig.profile}@{mig.start}")
        mask = compute = 0
        for p, s in remaining:
            mask |= slot_mask(s, table[p].size)
            compute += table[p].compute
        if mask & slot_mask(mig.start, prof.size) or compute + prof.compute > MIG_COMPUTE_SLICES:
            raise OversubscriptionError(f"{nid}: gpu {j} has no room for {mig.profile}@{mig.start}")

    def _mig_take(self, i: int, mig: MigAssignment) -> None:
        j = mig.gpu_index
        if mig.enables_mig:
            self.mig_enabled[i, j] = True
            self.milli_free[i, j] = 0
            self.gpu_mem_free[i, j] = 0
        inst = self.mig_instances.setdefault((i, j), {})
        for d in mig.destroyed:
            del inst[d]
        inst[(mig.profile, mig.start)] = True

    def _mig_give_back(self, i: int, mig: MigAssignment) -> None:
        j = mig.gpu_index
        inst = self.mig_instances[(i, j)]
        if mig.repartition:
            del inst[(mig.profile, mig.start)]
            for d in mig.destroyed:
                inst[d] = False
        else:
            inst[(mig.profile, mig.start)] = False
        if not inst and not self.mig_described[i, j]:
            # the last instance Tide created is gone: the GPU leaves MIG mode again
            del self.mig_instances[(i, j)]
            self.mig_enabled[i, j] = False
            self.milli_free[i, j] = MILLI
            self.gpu_mem_free[i, j] = self.gpu_mem_cap[i, j]

    # ------------------------------------------------------------------ consistency
    def check_consistency(self) -> None:
        """Raise AssertionError if any invariant is broken (used by tests)."""
        assert (self.cpu_free >= 0).all() and (self.cpu_free <= self.cpu_cap).all(), "cpu out of range"
        assert (self.mem_free >= 0).all() and (self.mem_free <= self.mem_cap).all(), "memory out of range"
        assert (self.milli_free >= 0).all() and (self.milli_free <= MILLI).all(), "milli out of range"
        assert (self.gpu_mem_free >= 0).all() and (self.gpu_mem_free <= self.gpu_mem_cap).all(), "gpu mem"
        assert not (self.milli_free[~self.gpu_exists]).any(), "padding gpu has capacity"
        assert not (self.milli_free[self.mig_enabled]).any(), "MIG gpu serves shares"
        for (i, j), inst in self.mig_instances.items():
            assert self.mig_enabled[i, j], "instances on a non-MIG gpu"
            table = profiles_for(self.models[self.gpu_model[i, j]])
            mask = compute = 0
            for p, s in inst:
                prof = table[p]
                assert s in prof.starts, f"{p} at illegal start {s}"
                m = slot_mask(s, prof.size)
                assert not mask & m, "overlapping MIG instances"
                mask |= m
                compute += prof.compute
            assert compute <= MIG_COMPUTE_SLICES, "MIG compute oversubscribed"


_STATIC_ARRAYS = frozenset(
    {"cpu_cap", "mem_cap", "ngpu", "gpu_exists", "gpu_model", "gpu_mem_cap", "mig_capable", "pcie", "numa",
     "nvlink", "node_model", "mig_described"}
)
