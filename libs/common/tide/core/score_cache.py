"""Per-node score caching for the placer: only nodes whose state changed are re-scored.

Every score plugin but ``random`` scores a candidate from its own node's state alone (plus static
cluster facts such as the largest node), so the best candidate of a node for a given request stays
the same until that node changes. ``NodeScoreCache`` keeps, per request shape, each node's best score
and the GPU of its best candidate, stamped with the node's ``Cluster.node_stamp``; only nodes whose
stamp differs are re-scored, through the same filter, candidate and plugin code as the uncached placer,
so the cached placer makes the same decisions (``tests/core/test_score_cache.py``). The fragmentation
of each node's current state ("before" a placement) is cached the same way, across request shapes.

Keyed safely:
- ``Cluster.allocate``/``release`` give the node a stamp unique in the process, so equal stamps mean
  equal node states in any two clusters sharing static arrays (a what-if copy and its original);
- a cluster with other static arrays (e.g. rebuilt from the same descriptions and claims every cycle)
  is compared by content with the last state seen: rows that match keep their cached scores, the rest
  are re-scored; a cluster of another shape or other capacities resets the cache. The cache holds
  references to the static arrays it compares by identity, so an identity cannot be reused;
- the memory request does not change a node's scores, only whether it is feasible: it is left out of
  the key and applied as a mask at decision time, so pods differing only in memory share an entry;
- the cache is cleared when the weights, the typical-pod workload or the cluster's GPU models change.

When many stale nodes are still in their described state (stamp 0), one node per hardware kind is
scored and its result copied to the others (a cold cache on a 10,000-node cluster).

A plugin whose scores also depend on a little cluster-wide state (the default policy's model pressure,
from the free milli-GPU per GPU model) declares it through ``BeforeFrag.depends_on``: a function of the
cluster and the request returning a hashable summary of that state, which becomes part of the entry
key, so rows are reused only under the same summary (the plugin must score from the summary alone).

MIG requests (instances live in a dict the stamps do not describe) and policies with a plugin that is
not node-local (``random``) take the uncached path.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tide.core.cluster import Cluster
from tide.core.frag import FragModel
from tide.core.model import MILLI, PodRequest
from tide.core.plugins.base import Candidates
from tide.core.topology import GpuPosition

_TOL = 1e-9  # the placer's tie tolerance
_ALIKE_MIN = 256  # when at least this many nodes are stale, score each distinct node state once
_CACHE_BYTES = 32 << 20  # bound on the cached per-node arrays (entries are dropped least recently used)


def request_key(req: PodRequest) -> tuple[Any, ...]:
    """What a node's scores depend on (everything but the memory request)."""
    return (req.cpu_milli, req.gpu_count, req.gpu_milli, req.gpu_mem_mib, req.mig_profile, req.gpu_models,
            req.node_selector)


@dataclass
class _Entry:
    static_ok: np.ndarray  # [N] selector and allowed GPU model (static)
    allowed: np.ndarray | None  # [N, G] GPUs of an allowed model (whole / share requests)
    score: np.ndarray  # [N] best candidate score per node, -inf where none
    pick: np.ndarray  # [N] GPU of the best candidate (shares), -1 otherwise
    stamp: np.ndarray  # [N] node epoch the row was computed at, -1: never


class NodeScoreCache:
    """Per-request-shape, per-node best scores of one placer, re-scored only where nodes changed."""

    def __init__(self) -> None:
        self._static: tuple[Any, ...] | None = None
        self._cluster: Cluster | None = None  # the last cluster seen (its static arrays are self._static)
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._before: dict[tuple[int, ...], tuple[tuple[FragModel, ...], list[np.ndarray], np.ndarray]] = {}
        self._positions: dict[int, list[GpuPosition]] = {}
        self._hardware: np.ndarray | None = None  # [N] id of each node's hardware class (static arrays)
        self._snap: dict[str, np.ndarray] = {}
        self._stamp = np.zeros(0, dtype=np.int64)
        self._max_entries = 16
        self._global: list[Callable[[Cluster, PodRequest], Hashable]] = []  # see ``depends_on``
        self._global_added = False
        self.rescored = 0  # node rows re-scored so far (for tests and benchmarks)

    def clear(self) -> None:
        """Forget every cached score (weights or workload changed); plugins declare their cluster-wide
        state again (``depends_on``) when they next score."""
        self._entries.clear()
        self._before.clear()
        self._global.clear()

    def depends_on(self, key: Callable[[Cluster, PodRequest], Hashable]) -> None:
        """Scores also depend on the cluster-wide state ``key(cluster, request)`` summarises (called by a
        plugin while it scores; idempotent). The other entries scored so far did not know it: they are
        dropped once the current decision is made."""
        if key not in self._global:
            self._global.append(key)
            self._global_added = True

    # ------------------------------------------------------------------ cluster tracking
    _DYNAMIC = ("milli_free", "gpu_mem_free", "cpu_free", "mig_enabled")
    _STATIC = ("gpu_exists", "gpu_model", "gpu_mem_cap", "cpu_cap", "mig_capable", "mig_described", "node_model",
               "pcie", "numa", "nvlink")
    _STATIC_LISTS = ("node_ids", "labels", "models", "racks", "spines")

    def _sync(self, cluster: Cluster) -> np.ndarray:
        """Track ``cluster``; returns its node stamps (what cached rows must match)."""
        stamps = cluster.node_stamp
        if cluster is self._cluster and self._static is not None:  # they are set together
            static = self._static
        else:
            static = tuple(getattr(cluster, a) for a in self._STATIC + self._STATIC_LISTS)
        if self._static is not None and (static is self._static or all(
                a is b for a, b in zip(static, self._static, strict=True))):
            self._cluster = cluster
            dirty = np.flatnonzero(stamps != self._stamp)
            if len(dirty):
                for name in self._DYNAMIC:
                    self._snap[name][dirty] = getattr(cluster, name)[dirty]
                self._stamp[dirty] = stamps[dirty]
            return stamps
        if self._static is not None and self._same_static(static):
            # another cluster object of the same make-up: keep the rows whose state is unchanged
            same = np.ones(len(stamps), dtype=bool)
            for name in self._DYNAMIC:
                new, old = getattr(cluster, name), self._snap[name]
                same &= (new == old).reshape(len(stamps), -1).all(axis=1)
            for stamp in [e.stamp for e in self._entries.values()] + [b[2] for b in self._before.values()]:
                keep = same & (stamp == self._stamp)
                stamp[:] = np.where(keep, stamps, -1)
        else:
            self._entries.clear()
            self._before.clear()
            self._max_entries = int(min(max(_CACHE_BYTES // (max(len(stamps), 1) * 40), 16), 4096))
        self._positions.clear()
        self._hardware = None
        self._static = static
        self._cluster = cluster
        self._snap = {name: getattr(cluster, name).copy() for name in self._DYNAMIC}
        self._stamp = stamps.copy()
        return stamps

    def _same_static(self, static: tuple[Any, ...]) -> bool:
        assert self._static is not None
        n_arr = len(self._STATIC)
        for k, (a, b) in enumerate(zip(static, self._static, strict=True)):
            if a is b:
                continue
            if k < n_arr:
                if a.shape != b.shape or not np.array_equal(a, b):
                    return False
            elif a != b:
                return False
        return True

    def before(self, cluster: Cluster) -> BeforeFrag:
        """The cache of each node's current fragmentation (per model), for ``Context.before_cache``."""
        return BeforeFrag(self, cluster)

    def _before_record(self, cluster: Cluster, models: tuple[FragModel, ...]
                       ) -> tuple[tuple[FragModel, ...], list[np.ndarray], np.ndarray]:
        key = tuple(id(m) for m in models)
        rec = self._before.get(key)
        if rec is None or any(a is not b for a, b in zip(rec[0], models, strict=True)):
            n = cluster.num_nodes
            rec = self._before[key] = (models, [np.zeros(n) for _ in models], np.full(n, -1, dtype=np.int64))
        return rec

    def positions(self, cluster: Cluster, node: int) -> list[GpuPosition]:
        pos = self._positions.get(node)
        if pos is None:
            pos = self._positions[node] = [cluster.position(node, g) for g in range(int(cluster.ngpu[node]))]
        return pos

    def _key(self, cluster: Cluster, req: PodRequest) -> tuple[Any, ...]:
        key = request_key(req)
        return (key, *(k(cluster, req) for k in self._global)) if self._global else key

    def _entry(self, cluster: Cluster, req: PodRequest) -> _Entry:
        key = self._key(cluster, req)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        from tide.core.filtering import allowed_gpus, selector_mask  # noqa: PLC0415 (import cycle)

        n = cluster.num_nodes
        ok = selector_mask(cluster, req) if req.node_selector else np.ones(n, dtype=bool)
        allowed = None
        if req.kind in ("whole", "share"):
            allowed = allowed_gpus(cluster, req)
            ok = ok & allowed.any(axis=1)
        entry = _Entry(ok, allowed, np.full(n, -np.inf), np.full(n, -1, dtype=np.int64),
                       np.full(n, -1, dtype=np.int64))
        self._entries[key] = entry
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return entry

    # ------------------------------------------------------------------ scoring
    def node_scores(
        self, cluster: Cluster, req: PodRequest, score: Callable[[Candidates], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """([N] best score per node, -inf where the request does not fit; [N] GPU of that candidate).

        ``score`` maps a batch of candidates to the policy's combined score. The memory request is
        applied here; the arrays returned must not be modified.
        """
        stamps = self._sync(cluster)
        entry = self._entry(cluster, req)
        stale = np.flatnonzero(entry.stamp != stamps)
        if len(stale):
            self._rescore(cluster, req, entry, stale, score)
            if self._global_added:
                # a plugin declared cluster-wide state: entries are keyed by it from now on. Rows scored
                # before did not know it, except this entry's, all scored now (the plugin declares when it
                # scores, and ``clear`` drops the declarations with the entries)
                self._global_added = False
                self._entries.clear()
                self._entries[self._key(cluster, req)] = entry
        out = entry.score
        if req.memory_mib:
            out = np.where(cluster.mem_free >= req.memory_mib, out, -np.inf)
        return out, entry.pick

    def _rescore(self, cluster: Cluster, req: PodRequest, entry: _Entry, stale: np.ndarray,
                 score: Callable[[Candidates], np.ndarray]) -> None:
        self.rescored += len(stale)
        entry.stamp[stale] = cluster.node_stamp[stale]
        entry.score[stale] = -np.inf
        entry.pick[stale] = -1
        nodes = stale[entry.static_ok[stale] & (cluster.cpu_free[stale] >= req.cpu_milli)]
        if len(nodes) >= _ALIKE_MIN:
            pristine = cluster.node_stamp[nodes] == 0
            if pristine.sum() >= _ALIKE_MIN // 2:
                # nodes in their described state (stamp 0) with the same hardware are in the same state:
                # score one of each kind (a cold cache on a large cluster is mostly such nodes)
                same = nodes[pristine]
                _, first, inverse = np.unique(self._hardware_ids(cluster)[same], return_index=True,
                                              return_inverse=True)
                reps = same[first]
                self._score_nodes(cluster, req, entry, np.concatenate((reps, nodes[~pristine])), score)
                entry.score[same] = entry.score[reps][inverse.ravel()]
                entry.pick[same] = entry.pick[reps][inverse.ravel()]
                return
        self._score_nodes(cluster, req, entry, nodes, score)

    def _hardware_ids(self, cluster: Cluster) -> np.ndarray:
        """[N] the same id for nodes whose static arrays (hardware, capacities, topology inside) match."""
        if self._hardware is None:
            n = cluster.num_nodes
            static = np.column_stack([np.asarray(getattr(cluster, a)).reshape(n, -1).astype(np.int64)
                                      for a in self._STATIC] + [cluster.ngpu, cluster.mem_cap])
            rows = np.ascontiguousarray(static)
            keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
            self._hardware = np.unique(keys, return_inverse=True)[1].ravel()
        return self._hardware

    def _score_nodes(self, cluster: Cluster, req: PodRequest, entry: _Entry, nodes: np.ndarray,
                     score: Callable[[Candidates], np.ndarray]) -> None:
        if len(nodes) == 0:
            return
        cand = subset_candidates(cluster, req, nodes, entry.allowed)
        if len(cand) == 0:
            return
        total = score(cand)
        node = cand.node
        new = np.empty(len(node), dtype=bool)  # first candidate of each node (they come grouped by node)
        new[:1] = True
        np.not_equal(node[1:], node[:-1], out=new[1:])
        starts = np.flatnonzero(new)
        if len(starts) == len(node):
            entry.score[node] = total
            entry.pick[node] = cand.gpu
            return
        # per node the best candidate, ties as ``placer.select``: least free milli-GPU left, then lowest GPU
        group = np.cumsum(new) - 1
        best = np.maximum.reduceat(total, starts)
        tied = total >= best[group] - _TOL
        g = np.maximum(cand.gpu, 0)
        left = cluster.milli_free[node, g]
        order = np.lexsort((g, left, ~tied, group))
        first = order[starts]  # sorted by group first, so each group's run starts where it did
        entry.score[node[first]] = total[first]
        entry.pick[node[first]] = cand.gpu[first]


class BeforeFrag:
    """Each node's fragmentation in its current state, per fragmentation model, valid per node stamp.

    ``Context`` asks which of its nodes are ``stale``, evaluates those together with its candidates
    (one batch) and hands the values back with ``update``; ``get`` then reads them all."""

    def __init__(self, cache: NodeScoreCache, cluster: Cluster):
        self.cache, self.cluster = cache, cluster
        self._models: tuple[FragModel, ...] = ()
        self._rec: tuple[tuple[FragModel, ...], list[np.ndarray], np.ndarray] | None = None

    def _record(self, models: tuple[FragModel, ...]) -> tuple[tuple[FragModel, ...], list[np.ndarray], np.ndarray]:
        if self._rec is None or models != self._models:
            self._models, self._rec = models, self.cache._before_record(self.cluster, models)
        return self._rec

    def stale(self, models: tuple[FragModel, ...], nodes: np.ndarray) -> np.ndarray:
        stamp = self._record(models)[2]
        stale: np.ndarray = nodes[stamp[nodes] != self.cluster.node_stamp[nodes]]
        return stale

    def update(self, models: tuple[FragModel, ...], nodes: np.ndarray, values: tuple[np.ndarray, ...]) -> None:
        _, arrays, stamp = self._record(models)
        for a, v in zip(arrays, values, strict=True):
            a[nodes] = v
        stamp[nodes] = self.cluster.node_stamp[nodes]

    def get(self, models: tuple[FragModel, ...], nodes: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(a[nodes] for a in self._record(models)[1])

    def depends_on(self, key: Callable[[Cluster, PodRequest], Hashable]) -> None:
        """See ``NodeScoreCache.depends_on``."""
        self.cache.depends_on(key)


@functools.cache
def _earlier(g: int) -> np.ndarray:
    """[g, h]: GPU h comes before GPU g."""
    return np.tri(g, g, -1, dtype=bool)


def subset_candidates(cluster: Cluster, req: PodRequest, nodes: np.ndarray, allowed: np.ndarray | None) -> Candidates:
    """``placer.build_candidates`` restricted to ``nodes`` (which passed the node filter), grouped by node.

    Leaner than the full version by the cluster's invariants: a GPU with all its milli-GPU free is
    wholly free (every claim on a GPU takes at least 1 milli, a GPU in MIG mode has 0 milli free, and
    padding GPUs have none), and a share needs milli-GPU free, so MIG and padding GPUs never qualify.
    A node's shares are deduplicated by free milli-GPU alone (its lowest GPU of each): no node-local
    score depends on GPU memory, so the best candidate per node is the same as the full placer's."""
    from tide.core.placer import _cands  # noqa: PLC0415 (import cycle)

    kind = req.kind
    milli = cluster.milli_free[nodes]
    if kind == "whole":
        full = milli == MILLI
        if req.gpu_models:
            assert allowed is not None
            full &= allowed[nodes]
        ok = full.sum(axis=1) >= req.gpu_count
        nodes, f = nodes[ok], full[ok]
        free_after = milli[ok]
        free_after[f & (np.cumsum(f, axis=1) <= req.gpu_count)] = 0
        return _cands(cluster, req, nodes, np.full(len(nodes), -1), free_after)
    if kind == "share":
        ok = milli >= req.gpu_milli
        if req.gpu_models:
            assert allowed is not None
            ok &= allowed[nodes]
        if req.gpu_mem_mib:
            ok &= cluster.gpu_mem_free[nodes] >= req.gpu_mem_mib
        state = np.where(ok, milli, -1)
        earlier_same = (state[:, :, None] == state[:, None, :]) & _earlier(state.shape[1])
        li, gi = np.nonzero(ok & ~earlier_same.any(axis=2))
        free_after = milli[li]
        free_after[np.arange(len(li)), gi] -= req.gpu_milli
        return _cands(cluster, req, nodes[li], gi, free_after)
    return _cands(cluster, req, nodes, np.full(len(nodes), -1), milli)
