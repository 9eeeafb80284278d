"""The placer: filter -> enumerate candidates -> score with weighted plugins -> select.

``Placer.place`` never mutates the cluster; apply the returned Allocation with ``cluster.allocate``.
With node-local plugins (all but ``random``) and non-MIG requests, the placer keeps each node's best
score per request shape and re-scores only the nodes whose state changed (``score_cache``); the
decisions are the same as without it (``Placer(cache=False)``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tide.core.cluster import Cluster, slot_mask
from tide.core.filtering import mig_gpus, never_fits, node_filter, share_free, whole_free
from tide.core.frag import CapacityFragModel, FragModel, TypicalPods
from tide.core.mig import MIG_COMPUTE_SLICES, profiles_for
from tide.core.model import MILLI, Allocation, MigAssignment, PodRequest, Unfit
from tide.core.plugins.base import Candidates, Context, ScorePlugin
from tide.core.plugins.bestfit import BestFitScore, WorstFitScore
from tide.core.plugins.dotproduct import DotProductScore
from tide.core.plugins.fgd import FgdScore
from tide.core.plugins.firstfit import FirstFitScore
from tide.core.plugins.gpupacking import GpuPackingScore
from tide.core.plugins.random_score import RandomScore
from tide.core.plugins.tide_frag import TideFragScore
from tide.core.plugins.topology_score import TopologyScore
from tide.core.score_cache import NodeScoreCache
from tide.core.topology import GpuPosition, pick_gpus

PLUGINS: dict[str, Callable[[], ScorePlugin]] = {
    "random": RandomScore,
    "firstfit": FirstFitScore,
    "bestfit": lambda: BestFitScore(quantize=True),
    "bestfit_fine": lambda: BestFitScore(quantize=False),
    "worstfit": WorstFitScore,
    "gpupacking": GpuPackingScore,
    "dotproduct": DotProductScore,
    "topology": TopologyScore,
    "fgd": lambda: FgdScore(quantize=True),
    "fgd_fine": lambda: FgdScore(quantize=False),
    "tide_frag": TideFragScore,
}


@dataclass(frozen=True)
class PolicySpec:
    name: str
    weights: dict[str, float]
    description: str


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec("random", {"random": 1.0}, "uniformly random feasible node"),
        PolicySpec("firstfit", {"firstfit": 1.0}, "first node in node order that fits, lowest GPU index"),
        PolicySpec("bestfit", {"bestfit": 1.0}, "least CPU+GPU left (reference BestFit)"),
        PolicySpec("worstfit", {"worstfit": 1.0}, "most CPU+GPU left (spread)"),
        PolicySpec("gpupacking", {"gpupacking": 1.0}, "shares onto shared GPUs, whole GPUs onto busy nodes"),
        PolicySpec("dotproduct", {"dotproduct": 1.0}, "Tetris-style alignment of free and requested"),
        PolicySpec("topology", {"topology": 1.0, "bestfit_fine": 0.01}, "closest GPUs, then best fit"),
        PolicySpec("fgd", {"fgd": 1.0}, "fragmentation gradient descent (reference FGD)"),
        # no topology tie-break: the benchmarks (docs/benchmarks.md) were measured without one
        PolicySpec("tide", {"tide_frag": 1.0}, "Tide: FGD refined (see tide_frag)"),
    )
}
DEFAULT_POLICY = "tide"

WORKLOAD_TOLERANCE = 0.01  # largest change of a typical pod's frequency that keeps the learnt workload
_MIG_EXISTING_BONUS = 1e6  # prefer an idle existing instance over any re-partitioning
_MIG_ENABLED_BONUS = 1e5  # then a GPU already in MIG mode over switching a new one
_MIG_DESTROY_PENALTY = 1e4  # per idle instance a re-partition destroys


class Placer:
    def __init__(
        self,
        policy: str = DEFAULT_POLICY,
        weights: dict[str, float] | None = None,
        seed: int | None = 0,
        workload: TypicalPods | None = None,
        window: int = 5000,
        tie_break: str = "first",
        cache: bool = True,
    ):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        self.policy = policy
        self.weights: dict[str, float] = dict(POLICIES[policy].weights)
        self._plugins: dict[str, ScorePlugin] = {}
        self._score_cache = NodeScoreCache() if cache else None
        self._cacheable = False
        self.set_weights(weights or {})
        if tie_break not in ("first", "random"):
            raise ValueError("tie_break must be 'first' (node order, as the reference simulator) or 'random'")
        self.tie_break = tie_break
        self.rng = np.random.default_rng(seed)
        self._workload = workload
        self._fixed_workload = workload is not None
        self._recent: deque[PodRequest] = deque(maxlen=window)
        self._since_refresh = 0
        self._frag_cache: tuple[int, tuple[str, ...], FragModel, FragModel] | None = None

    # ------------------------------------------------------------------ configuration
    def set_weights(self, weights: dict[str, float]) -> None:
        """Update plugin weights at run time (a weight of 0 disables a plugin; new names enable one)."""
        for name, w in weights.items():
            if name not in PLUGINS:
                raise ValueError(f"unknown plugin {name!r}; known: {', '.join(PLUGINS)}")
            self.weights[name] = float(w)
        self._plugins = {n: self._plugins.get(n) or PLUGINS[n]() for n, w in self.weights.items() if w}
        # node-local plugins score a candidate from its own node's state: their scores can be cached per node
        self._cacheable = all(getattr(p, "node_local", False) for p in self._plugins.values())
        if self._score_cache is not None:
            self._score_cache.clear()

    def set_workload(self, workload: TypicalPods | None) -> None:
        """Fix the typical-pod distribution fragmentation is measured against (None: learn online)."""
        self._workload = workload
        self._fixed_workload = workload is not None
        self._frag_cache = None

    def observe(self, req: PodRequest) -> None:
        """Record an arriving request for the online typical-pod distribution."""
        self._recent.append(req)
        self._since_refresh += 1
        if not self._fixed_workload and (self._workload is None or self._since_refresh >= 500):
            fresh = TypicalPods.from_requests(self._recent)
            self._since_refresh = 0
            # keep the model (and the cached scores) while the typical pods stay the same shapes and
            # their frequencies move by less than WORKLOAD_TOLERANCE
            if self._workload is None or not fresh.close_to(self._workload, WORKLOAD_TOLERANCE):
                self._workload = fresh
                self._frag_cache = None

    @property
    def workload(self) -> TypicalPods | None:
        return self._workload

    def _frag_models(self, cluster: Cluster) -> tuple[FragModel | None, FragModel | None]:
        wl = self._workload
        if wl is None or len(wl) == 0:
            return None, None
        key = (id(wl), tuple(cluster.models))
        if self._frag_cache is None or self._frag_cache[:2] != key:
            self._frag_cache = (*key, FragModel(wl, cluster.models), CapacityFragModel(wl, cluster.models))
            if self._score_cache is not None:
                self._score_cache.clear()
        return self._frag_cache[2], self._frag_cache[3]

    # ------------------------------------------------------------------ placement
    def place(self, cluster: Cluster, req: PodRequest) -> Allocation | Unfit:
        if self._score_cache is not None and self._cacheable and req.kind != "mig" and cluster.num_nodes:
            res = self._place_cached(cluster, req)
            if res is not None:
                return res
        return self._place_uncached(cluster, req)

    def _place_cached(self, cluster: Cluster, req: PodRequest) -> Allocation | None:
        """The same decision as ``_place_uncached`` from per-node cached scores; None when nothing fits
        (the uncached path then explains why)."""
        assert self._score_cache is not None
        frag = self._frag_models(cluster)
        before = self._score_cache.before(cluster)

        def score(cand: Candidates) -> np.ndarray:
            ctx = Context(cluster, req, cand, self.rng, *frag, before_cache=before)
            total = np.zeros(len(cand))
            for name, plugin in self._plugins.items():
                total += self.weights[name] * plugin.score(ctx)
            return total

        scores, pick = self._score_cache.node_scores(cluster, req, score)
        best = scores.max()
        if best == -np.inf:
            return None
        if self.tie_break == "random":
            tied = np.flatnonzero(scores >= best - 1e-9)
            node = int(tied[0] if len(tied) == 1 else tied[self.rng.integers(len(tied))])
        else:
            node = int(np.argmax(scores >= best - 1e-9))
        return allocation_at(cluster, req, node, int(pick[node]), float(scores[node]),
                             self._score_cache.positions(cluster, node))

    def _place_uncached(self, cluster: Cluster, req: PodRequest) -> Allocation | Unfit:
        reason = never_fits(cluster, req)
        if reason is not None:
            return Unfit(reason, resolvable=False)
        mask, reasons = node_filter(cluster, req)
        cand, gpu_reason = build_candidates(cluster, req, mask)
        if len(cand) == 0:
            if gpu_reason:
                reasons.append(gpu_reason)
            return Unfit(f"0/{cluster.num_nodes} nodes fit: " + "; ".join(reasons), resolvable=True)
        ctx = Context(cluster, req, cand, self.rng, *self._frag_models(cluster))
        total = np.zeros(len(cand))
        for name, plugin in self._plugins.items():
            total += self.weights[name] * plugin.score(ctx)
        if cand.mig_start is not None:
            total += mig_preference(cluster, cand)
        k = select(total, cand, ctx.free_before, self.rng if self.tie_break == "random" else None)
        return make_allocation(cluster, req, cand, k, float(total[k]))

    def place_many(self, cluster: Cluster, reqs: Iterable[PodRequest]) -> list[Allocation | Unfit]:
        """Place requests in order on a what-if copy; the cluster itself is not changed."""
        what_if = cluster.copy()
        out: list[Allocation | Unfit] = []
        for r in reqs:
            res = self.place(what_if, r)
            if isinstance(res, Allocation):
                what_if.allocate(res)
            out.append(res)
        return out


def select(total: np.ndarray, cand: Candidates, free_before: np.ndarray, rng: np.random.Generator | None) -> int:
    """Best node (ties: first in node order, or random with ``rng``), then its best candidate
    (ties: least free GPU, then lowest GPU index)."""
    best = total.max()
    tied = np.flatnonzero(total >= best - 1e-9)
    if rng is None:
        node = cand.node[tied].min()
    else:
        nodes = np.unique(cand.node[tied])
        node = nodes[0] if len(nodes) == 1 else nodes[rng.integers(len(nodes))]
    in_node = tied[cand.node[tied] == node]
    if len(in_node) == 1:
        return int(in_node[0])
    g = np.maximum(cand.gpu[in_node], 0)
    left = free_before[in_node, g]
    return int(in_node[np.lexsort((g, left))[0]])


def build_candidates(cluster: Cluster, req: PodRequest, mask: np.ndarray) -> tuple[Candidates, str]:
    kind = req.kind
    if kind == "whole":
        full = whole_free(cluster, req)
        ok = mask & (full.sum(axis=1) >= req.gpu_count)
        nodes = np.flatnonzero(ok)
        free_after = cluster.milli_free[nodes].copy()
        f = full[nodes]
        take = f & (np.cumsum(f, axis=1) <= req.gpu_count)
        free_after[take] = 0
        why = "" if len(nodes) else f"the others have fewer than {req.gpu_count} free GPUs{_models(req)}"
        return _cands(cluster, req, nodes, np.full(len(nodes), -1), free_after), why
    if kind == "share":
        ok = share_free(cluster, req) & mask[:, None]
        ni, gi = np.nonzero(ok)
        if len(ni):
            key = (ni * (MILLI + 1) + cluster.milli_free[ni, gi]) * (1 << 21) + np.minimum(
                cluster.gpu_mem_free[ni, gi], (1 << 21) - 1
            )
            _, first = np.unique(key, return_index=True)
            ni, gi = ni[first], gi[first]
        free_after = cluster.milli_free[ni].copy()
        free_after[np.arange(len(ni)), gi] -= req.gpu_milli
        why = "" if len(ni) else (
            f"the others have no GPU{_models(req)} with {req.gpu_milli}m and {req.gpu_mem_mib} MiB free"
        )
        return _cands(cluster, req, ni, gi, free_after), why
    if kind == "mig":
        return _mig_candidates(cluster, req, mask)
    nodes = np.flatnonzero(mask)
    return _cands(cluster, req, nodes, np.full(len(nodes), -1), cluster.milli_free[nodes].copy()), ""


def _models(req: PodRequest) -> str:
    return f" of model {'|'.join(req.gpu_models)}" if req.gpu_models else ""


def _cands(cluster: Cluster, req: PodRequest, nodes: np.ndarray, gpus: np.ndarray, free_after: np.ndarray,
           **extra: Any) -> Candidates:
    return Candidates(
        node=nodes.astype(np.int64),
        gpu=gpus.astype(np.int64),
        free_after=free_after,
        cpu_after=cluster.cpu_free[nodes] - req.cpu_milli,
        mem_after=cluster.mem_free[nodes] - req.memory_mib,
        **extra,
    )


def mig_options(
    cluster: Cluster, node: int, gpu: int, profile: str
) -> list[tuple[int, bool, tuple[tuple[str, int], ...]]]:
    """Ways to get ``profile`` on one GPU: (start, existing, destroyed idle instances)."""
    table = profiles_for(cluster.models[cluster.gpu_model[node, gpu]])
    prof = table[profile]
    inst = cluster.mig_instances.get((node, gpu), {})
    enabled = bool(cluster.mig_enabled[node, gpu])
    untouched = (
        cluster.milli_free[node, gpu] == MILLI and cluster.gpu_mem_free[node, gpu] == cluster.gpu_mem_cap[node, gpu]
    )
    if not enabled and not untouched:
        return []  # busy with whole/share work
    existing: list[tuple[int, bool, tuple[tuple[str, int], ...]]] = [
        (s, True, ()) for (p, s), used in inst.items() if p == profile and not used]
    if existing:
        return existing
    out: list[tuple[int, bool, tuple[tuple[str, int], ...]]] = []
    for start in prof.starts:
        want = slot_mask(start, prof.size)
        destroyed, mask, compute, blocked = [], 0, 0, False
        for (p, s), used in inst.items():
            m = slot_mask(s, table[p].size)
            if m & want:
                if used:
                    blocked = True
                    break
                destroyed.append((p, s))
            else:
                mask |= m
                compute += table[p].compute
        if blocked or compute + prof.compute > MIG_COMPUTE_SLICES:
            continue
        out.append((start, False, tuple(sorted(destroyed))))
    return out


def _mig_candidates(cluster: Cluster, req: PodRequest, mask: np.ndarray) -> tuple[Candidates, str]:
    ok = mig_gpus(cluster, req) & mask[:, None]
    nodes, gpus, starts, existing, destroyed = [], [], [], [], []
    for n, g in zip(*np.nonzero(ok), strict=True):
        for start, ex, dest in mig_options(cluster, int(n), int(g), req.mig_profile or ""):
            nodes.append(n)
            gpus.append(g)
            starts.append(start)
            existing.append(ex)
            destroyed.append(len(dest))
    ni = np.array(nodes, dtype=np.int64)
    gi = np.array(gpus, dtype=np.int64)
    free_after = cluster.milli_free[ni].copy()
    if len(ni):
        free_after[np.arange(len(ni)), gi] = 0
    cand = _cands(
        cluster, req, ni, gi, free_after,
        mig_start=np.array(starts, dtype=np.int64), mig_existing=np.array(existing, dtype=bool),
    )
    cand._mig_destroyed = np.array(destroyed, dtype=np.int64)  # type: ignore[attr-defined]
    why = "" if len(ni) else f"no MIG-capable GPU{_models(req)} has room for {req.mig_profile}"
    return cand, why


def mig_preference(cluster: Cluster, cand: Candidates) -> np.ndarray:
    """Existing idle instance >> GPU already in MIG mode (fuller first) >> switching an idle GPU."""
    assert cand.mig_existing is not None
    enabled = cluster.mig_enabled[cand.node, cand.gpu]
    used_slots = np.array(
        [bin(cluster.mig_slots_used(int(n), int(g))[0]).count("1") for n, g in zip(cand.node, cand.gpu, strict=True)]
    )
    destroyed = getattr(cand, "_mig_destroyed", np.zeros(len(cand)))
    preference: np.ndarray = (
        _MIG_EXISTING_BONUS * cand.mig_existing
        + _MIG_ENABLED_BONUS * enabled
        - _MIG_DESTROY_PENALTY * destroyed
        + 100.0 * used_slots
    )
    return preference


def whole_gpus_at(cluster: Cluster, req: PodRequest, n: int,
                  positions: list[GpuPosition] | None = None) -> tuple[int, ...]:
    """The GPUs a whole-GPU request gets on node ``n``: of its wholly free GPUs (of an allowed model), the
    ``gpu_count`` closest together (``pick_gpus``). The ``topology`` plugin scores exactly these."""
    row = (cluster.gpu_exists[n] & ~cluster.mig_enabled[n] & (cluster.milli_free[n] == MILLI)
           & (cluster.gpu_mem_free[n] == cluster.gpu_mem_cap[n]))
    if req.gpu_models:
        row &= np.isin(cluster.gpu_model[n], [cluster.model_id(m) for m in req.gpu_models])
    if positions is None:
        positions = [cluster.position(n, g) for g in range(cluster.ngpu[n])]
    return pick_gpus([int(g) for g in np.flatnonzero(row)], positions, req.gpu_count)


def allocation_at(cluster: Cluster, req: PodRequest, n: int, gpu: int, score: float,
                  positions: list[GpuPosition] | None = None) -> Allocation:
    """The allocation of a whole, share or CPU-only request on node ``n`` (``gpu``: the share's GPU)."""
    common: dict[str, Any] = {"node_id": cluster.node_ids[n], "cpu_milli": req.cpu_milli, "memory_mib": req.memory_mib,
              "score": score}
    if req.kind == "whole":
        gpus = whole_gpus_at(cluster, req, n, positions)
        return Allocation(
            gpu_indices=gpus,
            gpu_milli=(MILLI,) * len(gpus),
            gpu_mem_mib=tuple(int(cluster.gpu_mem_cap[n, g]) for g in gpus),
            **common,
        )
    if req.kind == "share":
        return Allocation(gpu_indices=(gpu,), gpu_milli=(req.gpu_milli,), gpu_mem_mib=(req.gpu_mem_mib,), **common)
    return Allocation(**common)


def make_allocation(cluster: Cluster, req: PodRequest, cand: Candidates, k: int, score: float) -> Allocation:
    n = int(cand.node[k])
    if req.kind != "mig":
        return allocation_at(cluster, req, n, int(cand.gpu[k]), score)
    node_id = cluster.node_ids[n]
    common: dict[str, Any] = {"node_id": node_id, "cpu_milli": req.cpu_milli, "memory_mib": req.memory_mib,
                              "score": score}
    assert cand.mig_start is not None and cand.mig_existing is not None
    g, start = int(cand.gpu[k]), int(cand.mig_start[k])
    opts = {s: d for s, _, d in mig_options(cluster, n, g, req.mig_profile or "")}
    existing = bool(cand.mig_existing[k])
    mig = MigAssignment(
        gpu_index=g,
        profile=req.mig_profile or "",
        start=start,
        repartition=not existing,
        destroyed=() if existing else opts[start],
        enables_mig=not bool(cluster.mig_enabled[n, g]),
    )
    return Allocation(mig=mig, **common)
