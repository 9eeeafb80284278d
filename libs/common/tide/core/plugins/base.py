"""The scoring-plugin interface (filter -> score -> select, as in the Kubernetes scheduler framework).

The placer filters nodes and enumerates candidate placements (a node, plus the GPU for a share or a
MIG instance). Each score plugin maps the whole batch of candidates to one float per candidate,
higher is better; the placer combines them with the policy's weights and selects.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
from tide.core.frag import FragModel, frag_many, pairable
from tide.core.model import MILLI, PodRequest

if TYPE_CHECKING:  # pragma: no cover
    from tide.core.cluster import Cluster


@dataclass
class Candidates:
    """A batch of C candidate placements for one request."""

    node: np.ndarray  # [C] node index (candidates come grouped by node, in node order)
    gpu: np.ndarray  # [C] GPU index for shares/MIG, -1 otherwise
    free_after: np.ndarray  # [C, G] milli-GPU free per GPU after placing
    cpu_after: np.ndarray  # [C]
    mem_after: np.ndarray  # [C]
    mig_start: np.ndarray | None = None  # [C] for MIG candidates
    mig_existing: np.ndarray | None = None  # [C] bool: an idle instance exists already

    def __len__(self) -> int:
        return len(self.node)


class BeforeFragCache(Protocol):
    def stale(self, models: tuple[FragModel, ...], nodes: np.ndarray) -> np.ndarray: ...

    def update(self, models: tuple[FragModel, ...], nodes: np.ndarray, values: tuple[np.ndarray, ...]) -> None: ...

    def get(self, models: tuple[FragModel, ...], nodes: np.ndarray) -> tuple[np.ndarray, ...]: ...

    def depends_on(self, key: Callable[[Cluster, PodRequest], Hashable]) -> None: ...


@dataclass
class Context:
    cluster: Cluster
    request: PodRequest
    cand: Candidates
    rng: np.random.Generator
    frag: FragModel | None = None
    frag_capacity: FragModel | None = None
    before_cache: BeforeFragCache | None = None
    """each node's fragmentation in its current state, kept by the placer's score cache"""
    _cache: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def free_before(self) -> np.ndarray:
        arr = self._cache.get("free_before")
        if arr is None:
            arr = self._cache["free_before"] = self.cluster.milli_free[self.cand.node]
        return arr

    def _nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(first candidate's node of each run of candidates on one node, index of each candidate's run).

        The placer builds candidates grouped by node, so the runs are the distinct nodes (were they not,
        a node would just appear in several runs: still correct)."""
        arr = self._cache.get("nodes")
        if arr is None:
            node = self.cand.node
            new = np.empty(len(node), dtype=bool)
            new[:1] = True
            np.not_equal(node[1:], node[:-1], out=new[1:])
            self._cache["nodes"], self._cache["inverse"] = node[new], np.cumsum(new) - 1
        return self._cache["nodes"], self._cache["inverse"]

    def _deltas(self, models: tuple[FragModel, ...]) -> tuple[np.ndarray, ...]:
        """Each model's fragmentation increase per candidate: after minus before, evaluated in one batch
        (the candidates' after-states plus the before-states of their nodes that no cache holds)."""
        c, cand = self.cluster, self.cand
        nodes, inverse = self._nodes()
        cache = self.before_cache
        need = nodes if cache is None else cache.stale(models, nodes)
        k = len(cand)
        if len(need):
            free = np.concatenate((cand.free_after, c.milli_free[need]))
            cpu = np.concatenate((cand.cpu_after, c.cpu_free[need]))
            model = np.concatenate((c.node_model[cand.node], c.node_model[need]))
        else:
            free, cpu, model = cand.free_after, cand.cpu_after, c.node_model[cand.node]
        out = frag_many(models, free, cpu, model)
        if cache is None:
            before = tuple(v[k:] for v in out)
        else:
            if len(need):
                cache.update(models, need, tuple(v[k:] for v in out))
            before = cache.get(models, nodes)
        return tuple(v[:k] - b[inverse] for v, b in zip(out, before, strict=True))

    def frag_delta(self, capacity: bool = False) -> np.ndarray:
        """Increase of fragmented milli-GPU per candidate (after - before); 0 without a workload.

        ``capacity`` selects the CPU-aware (repeated-pod) fragmentation model instead of FGD's."""
        name = "frag_delta_cap" if capacity else "frag_delta"
        model = self.frag_capacity if capacity else self.frag
        arr = self._cache.get(name)
        if arr is None:
            arr = np.zeros(len(self.cand)) if model is None else self._deltas((model,))[0]
            self._cache[name] = arr
        return arr

    def frag_deltas(self) -> tuple[np.ndarray, np.ndarray]:
        """``(frag_delta(), frag_delta(capacity=True))``, computed in one pass when possible."""
        if "frag_delta" not in self._cache and "frag_delta_cap" not in self._cache:
            fgd, cap = self.frag, self.frag_capacity
            if fgd is not None and cap is not None and pairable(fgd, cap):
                self._cache["frag_delta"], self._cache["frag_delta_cap"] = self._deltas((fgd, cap))
        return self.frag_delta(), self.frag_delta(capacity=True)

    def max_cpu(self) -> float:
        return float(max(self.cluster.cpu_cap.max(initial=1), 1))

    def max_gpu_milli(self) -> float:
        return float(max(self.cluster.ngpu.max(initial=1), 1) * MILLI)


class ScorePlugin(Protocol):
    name: str
    node_local: bool
    """True when a candidate's score depends only on its own node's free resources and hardware (GPU
    models, capacities, topology inside the node), the request's CPU and GPU asks and static
    cluster-wide facts: never on other nodes' state, the node's name, labels or rack, the memory
    requests, or randomness. The placer may then cache it per node and score alike nodes once."""

    def score(self, ctx: Context) -> np.ndarray:
        """One score per candidate; higher is better."""
        ...
