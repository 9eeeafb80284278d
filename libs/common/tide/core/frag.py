"""GPU fragmentation measured against a workload distribution ("typical pods").

Follows Weng et al., "Beware of Fragmentation" (ATC'23): for one node and one typical pod, if the
pod cannot run on the node (GPU model, CPU, or not enough GPUs with enough free milli-GPU), all the
node's idle milli-GPU is fragmented for that pod; if it can, only the GPUs with less free milli-GPU
than the pod needs per GPU count. CPU-only typical pods see all idle GPU as fragmented. The node's
fragmentation is the frequency-weighted sum over typical pods.

Everything is vectorised over a batch of node states ``free[S, G]`` (milli-GPU free per GPU),
``cpu[S]`` and ``model[S]`` so that a policy can score every candidate placement at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tide.core.model import MILLI, PodRequest

_DEDUPE_MIN = 64  # batches at least this large are evaluated per distinct state


@dataclass(frozen=True, slots=True)
class PodShape:
    cpu_milli: int
    gpu_count: int
    gpu_milli: int  # per GPU: 1000 for whole GPUs, < 1000 for a share, 0 for CPU-only
    gpu_models: tuple[str, ...] = ()

    @classmethod
    def of(cls, req: PodRequest) -> PodShape:
        if req.gpu_count:
            return cls(req.cpu_milli, req.gpu_count, MILLI, tuple(sorted(set(req.gpu_models))))
        if req.gpu_milli:
            return cls(req.cpu_milli, 1, req.gpu_milli, tuple(sorted(set(req.gpu_models))))
        return cls(req.cpu_milli, 0, 0, ())

    def sort_key(self) -> tuple[int, int, int, str]:
        return (self.cpu_milli, self.gpu_milli, self.gpu_count, "|".join(self.gpu_models))


@dataclass(frozen=True)
class TypicalPods:
    shapes: tuple[PodShape, ...]
    weights: tuple[float, ...]  # sums to 1
    counts: tuple[tuple[PodShape, int], ...] = ()  # every shape seen, for re-weighting

    @classmethod
    def from_requests(cls, requests: Iterable[PodRequest], coverage: float = 0.95) -> TypicalPods:
        """The most frequent shapes that together cover ``coverage`` of the pods, renormalised."""
        counts = Counter(PodShape.of(r) for r in requests if r.mig_profile is None)
        return cls.from_counts(counts, coverage)

    @classmethod
    def from_counts(cls, counts: Counter[PodShape] | dict[PodShape, int], coverage: float = 0.95) -> TypicalPods:
        if not counts:
            return cls((), ())
        total = sum(counts.values())
        ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True)
        chosen: list[tuple[PodShape, int]] = []
        cum = 0
        for shape, cnt in ordered:
            if cum >= coverage * total:
                break
            chosen.append((shape, cnt))
            cum += cnt
        return cls(tuple(s for s, _ in chosen), tuple(c / cum for _, c in chosen), tuple(counts.items()))

    def by_demand(self, coverage: float = 0.95, cpu_only_share: float = 0.1) -> TypicalPods:
        """Shapes weighted by their share of GPU demand instead of their pod count.

        Large multi-GPU pods are rare but carry much of the GPU demand; weighting by demand makes
        breaking up the idle nodes they need count. CPU-only shapes keep ``cpu_only_share`` of the
        weight (split by count) so that CPU consumption on GPU nodes still matters.
        """
        counts = dict(self.counts)
        gpu = {s: c * s.gpu_count * s.gpu_milli for s, c in counts.items() if s.gpu_count}
        cpu = {s: c for s, c in counts.items() if not s.gpu_count}
        if not gpu:
            return self
        g_total = sum(gpu.values())
        chosen, cum = [], 0
        for shape, dem in sorted(gpu.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True):
            if cum >= coverage * g_total:
                break
            chosen.append((shape, dem))
            cum += dem
        c_total = sum(cpu.values())
        share = cpu_only_share if c_total else 0.0
        shapes = [s for s, _ in chosen] + list(cpu)
        weights = [(1 - share) * d / cum for _, d in chosen] + [share * c / c_total for c in cpu.values()]
        return TypicalPods(tuple(shapes), tuple(weights), self.counts)

    def __len__(self) -> int:
        return len(self.shapes)

    def close_to(self, other: TypicalPods, tolerance: float) -> bool:
        """Same typical shapes, each frequency within ``tolerance`` of the other's."""
        if set(self.shapes) != set(other.shapes):
            return False
        theirs = dict(zip(other.shapes, other.weights, strict=True))
        return all(abs(w - theirs[s]) <= tolerance for s, w in zip(self.shapes, self.weights, strict=True))


class FragModel:
    """Typical pods compiled against one cluster's GPU model ids, for fast batch evaluation."""

    def __init__(self, typical: TypicalPods, models: list[str]):
        self.typical = typical
        self.models = tuple(models)
        t = len(typical.shapes)
        self.cpu = np.array([s.cpu_milli for s in typical.shapes], dtype=np.int64)
        self.count = np.array([s.gpu_count for s in typical.shapes], dtype=np.int64)
        milli = np.array([s.gpu_milli for s in typical.shapes], dtype=np.int64)
        self.weight = np.array(typical.weights, dtype=np.float64)
        self.is_gpu = self.count > 0
        self.thresholds, self.t_k = np.unique(np.where(self.is_gpu, milli, MILLI), return_inverse=True)
        # model_ok[model_id + 1, t]; row 0 is "node without GPUs"
        ok = np.zeros((len(models) + 1, t), dtype=bool)
        for k, s in enumerate(typical.shapes):
            ok[1:, k] = [not s.gpu_models or m in s.gpu_models for m in models] if models else []
        self.model_ok = ok
        # some typical GPU pod cannot use some of the cluster's GPU models
        self.restricted = bool(len(models) and (self.is_gpu & ~ok[1:].all(axis=0)).any())
        self._table: np.ndarray | None = None
        # row vectors used per evaluation
        self.gpu_ok = ok & self.is_gpu[None, :]  # model_ok for GPU shapes only
        self.count_row = self.count[None, :]
        self.cpu_row = self.cpu[None, :]
        self.count_div = np.maximum(self.count, 1)[None, :]
        self.cpu_div = np.maximum(self.cpu, 1)[None, :]
        self.unit = (self.thresholds[self.t_k] * np.maximum(self.count, 1))[None, :]  # milli one pod takes
        gpu_demand = float((self.weight * self.count * milli).sum())
        # CPU the typical GPU pod asks per milli-GPU (ratio of the frequency-weighted totals)
        self.cpu_per_milli = float((self.weight * self.cpu * self.is_gpu).sum()) / gpu_demand if gpu_demand else 0.0

    def gpu_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-GPU terms by free milli-GPU (0..1000): [1001, 3K] copies per GPU (free // threshold), GPUs with
        room (free >= threshold) and milli on them, per distinct threshold; and the columns [3T] for the
        typical pods. Summed over a node's GPUs they give what ``frag`` needs in two array operations."""
        if self._table is None:
            f = np.arange(MILLI + 1, dtype=np.int64)[:, None]
            thr = self.thresholds[None, :]
            self._table = np.concatenate((f // thr, f >= thr, f * (f >= thr)), axis=1)
            k, t_k = len(self.thresholds), self.t_k
            self._table_cols = np.concatenate((t_k, k + t_k, 2 * k + t_k))
        return self._table, self._table_cols

    def frag_states(self, free: np.ndarray, cpu: np.ndarray, model: np.ndarray) -> np.ndarray:
        """``frag`` evaluated once per distinct node state (many nodes are alike: idle nodes of a type)."""
        d = distinct_states(free, cpu, model)
        if d is None:
            return self.frag(free, cpu, model)
        first, inverse = d
        states: np.ndarray = self.frag(free[first], cpu[first], model[first])[inverse]
        return states

    def frag(self, free: np.ndarray, cpu: np.ndarray, model: np.ndarray) -> np.ndarray:
        """Fragmented milli-GPU of each node state (frequency-weighted over typical pods)."""
        total = free.sum(axis=1)
        if len(self.weight) == 0:
            return np.zeros(len(total))
        table, cols = self.gpu_table()
        t = len(self.weight)
        sums = table[free].sum(axis=1)[:, cols[t:]]  # S, 2T: GPUs with room, milli on them
        ge, usable = sums[:, :t], sums[:, t:]
        fits = (ge >= self.count_row) & (cpu[:, None] >= self.cpu_row) & self.gpu_ok[model + 1]
        tot = total[:, None]
        frag = np.where(fits, tot - usable, tot)
        per_row: np.ndarray = (frag * self.weight).sum(axis=1)  # so a state scores the same in any batch
        return per_row


class CapacityFragModel(FragModel):
    """CPU-aware fragmentation: idle milli-GPU that repeated pods of one typical shape cannot use.

    For each typical pod the node packs ``min(GPU slots, CPU slots)`` copies of it, where GPU slots
    count whole copies that fit the per-GPU free milli-GPU and CPU slots the copies the free CPU
    allows; everything idle beyond what those copies use is fragmented for that shape. Unlike the
    single-pod test of FGD, a node whose CPU runs out before its GPUs do shows its stranded GPUs.
    """

    def frag(self, free: np.ndarray, cpu: np.ndarray, model: np.ndarray) -> np.ndarray:
        total = free.sum(axis=1)
        if len(self.weight) == 0:
            return np.zeros(len(total))
        per_gpu = free[:, :, None] // self.thresholds[None, None, :]  # S, G, K copies per GPU
        slots = per_gpu.sum(axis=1)[:, self.t_k] // np.maximum(self.count, 1)[None, :]  # S, T
        cpu_slots = cpu[:, None] // np.maximum(self.cpu, 1)[None, :]
        pods = np.minimum(slots, cpu_slots)
        pods = np.where(self.model_ok[model + 1] & self.is_gpu[None, :], pods, 0)
        used = pods * (self.thresholds[self.t_k] * np.maximum(self.count, 1))[None, :]
        frag = total[:, None] - np.minimum(used, total[:, None])
        per_row: np.ndarray = (frag * self.weight).sum(axis=1)  # so a state scores the same in any batch
        return per_row


def distinct_states(free: np.ndarray, cpu: np.ndarray, model: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(first row of each distinct state, inverse) when a large batch has few distinct states, else None."""
    if len(cpu) < _DEDUPE_MIN:
        return None
    rows = np.ascontiguousarray(np.column_stack((free, cpu, model)).astype(np.int64, copy=False))
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if len(first) > 0.7 * len(cpu):
        return None
    return first, inverse.ravel()


def pairable(fgd: FragModel, cap: FragModel) -> bool:
    """Whether ``frag_pair`` can evaluate the two models together."""
    return (type(fgd) is FragModel and type(cap) is CapacityFragModel and cap.typical is fgd.typical
            and cap.models == fgd.models)


def frag_many(models: tuple[FragModel, ...], free: np.ndarray, cpu: np.ndarray, model: np.ndarray
              ) -> tuple[np.ndarray, ...]:
    """Each model's ``frag`` of the same states (a FGD + capacity pair in one pass)."""
    if len(models) == 2 and pairable(*models):
        return frag_pair(models[0], models[1], free, cpu, model)
    return tuple(m.frag_states(free, cpu, model) for m in models)


def frag_pair(fgd: FragModel, cap: FragModel, free: np.ndarray, cpu: np.ndarray, model: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """``(fgd.frag(...), cap.frag(...))`` in one pass (both compiled from the same typical pods and
    cluster models; ``cap`` a ``CapacityFragModel``): the same values, about half the work."""
    d = distinct_states(free, cpu, model)
    if d is not None:
        first, inverse = d
        a, b = frag_pair(fgd, cap, free[first], cpu[first], model[first])
        return a[inverse], b[inverse]
    total = free.sum(axis=1)
    if len(fgd.weight) == 0:
        return np.zeros(len(total)), np.zeros(len(total))
    table, cols = fgd.gpu_table()
    t = len(fgd.weight)
    sums = table[free].sum(axis=1)[:, cols]  # S, 3T
    slots, ge, usable = sums[:, :t], sums[:, t:2 * t], sums[:, 2 * t:]
    ok = fgd.gpu_ok[model + 1]
    tot = total[:, None]
    cpu = cpu[:, None]
    fits = (ge >= fgd.count_row) & (cpu >= fgd.cpu_row) & ok
    f1 = np.where(fits, tot - usable, tot)
    pods = np.minimum(slots // cap.count_div, cpu // cap.cpu_div)
    used = np.where(ok, pods, 0) * cap.unit
    f2 = tot - np.minimum(used, tot)
    return (f1 * fgd.weight).sum(axis=1), (f2 * cap.weight).sum(axis=1)
