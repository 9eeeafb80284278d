"""The preempt and reclaim actions (pure): which running jobs a job that does not fit may evict, and
the cheapest whole set of them that lets it fit.

A candidate victim is a running job that is preemptible (not ``preemptible: false``, not of a class
that is not) and has run its minimum runtime for the reason it is taken. The reasons:

- **priority, inside its subtree**: a lower-priority job of the preemptor's own queue (or of a queue
  on its own path): always eligible, limits included (Kueue ``withinClusterQueue: LowerPriority``);
- **priority, across queues**: a lower-priority job of another queue, but only work that queue runs
  beyond its guarantee;
- **guarantee reclaim**: any job of another queue that runs beyond its guarantee, when the preemptor's
  side (the child of the two queues' common ancestor) stays within its own guarantee after admission;
- **fair-share reclaim**: a job of no higher priority of another queue that runs beyond its guarantee,
  when the preemptor's side's weighted borrowing share after admission plus the hysteresis threshold is
  still below the victim side's after the eviction;
- **tide**: borrowed work on nodes the preemptor's pool lends.

Protection: a cross-queue victim (all but the first and last reason) may not take its queue, or any
queue on its path up to the common ancestor's child, below its guarantee in a resource the preemptor
asks for. The minimum runtime of a victim is its queue's (or the config's) ``minRuntime.priority`` for
priority preemption, capped by the preemptor class's ``minRuntime`` (online-serving: 0), and
``minRuntime.reclaim`` for the others; best-effort work has none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tide.core.cluster import Cluster
from tide.core.cycle_context import CycleContext, Preemption
from tide.core.job_placement import job_demand, place_job, pod_request, topology_levels
from tide.core.model import Allocation, PodRequest, Unfit
from tide.core.placer import Placer
from tide.core.queues import (
    EPS,
    Excess,
    QueueTree,
    Resources,
    RunningJob,
    VictimGuard,
    borrowing_share,
    select_victims,
    within_guarantee,
)
from tide.core.tidal import borrows_from, selector_pool
from tide.core.topology import Level
from tide.schemas.events import JobRecord, JobState
from tide.schemas.feedback import FamilyWeights
from tide.schemas.job import PRIORITY_VALUES, JobSpec, PriorityClass


def job_preemptible(tree: QueueTree, spec: JobSpec) -> bool:
    """May this job ever be a victim? Not with ``preemptible: false``, nor if its class says so."""
    if spec.spec.preemptible is False:
        return False
    return tree.class_policy(spec.metadata.priority_class.value).preemptible


@dataclass(frozen=True)
class Candidate:
    """Why a running job may be evicted for this preemptor."""

    queue: str
    demand: Mapping[str, float]
    protected: tuple[str, ...]  # queue paths that must stay at or above their guarantee (empty: none)
    fair_only: bool  # eligible only by fair share: the guard checks the shares
    sides: tuple[str, str] | None  # (preemptor's side, victim's side) below the common ancestor
    why: str
    extra: bool = False  # one elastic extra pod (``pod`` of ``job_id``), not the whole job
    job_id: str = ""
    pod: int = -1


class QueueGuard(VictimGuard):
    """Guarantee protection and fair-share hysteresis over a set of victims (see the module docstring)."""

    def __init__(self, ctx: CycleContext, demand: Mapping[str, float], candidates: dict[str, Candidate]) -> None:
        self.ctx, self.demand, self.candidates = ctx, demand, candidates
        self.removed: dict[str, Resources] = {}

    def reset(self) -> None:
        self.removed = {}

    def _after(self, path: str, extra: Mapping[str, float] | None = None) -> Resources:
        u = dict(self.ctx.usage.get(path))
        for r, v in self.removed.get(path, {}).items():
            u[r] = u.get(r, 0.0) - v
        for r, v in (extra or {}).items():
            u[r] = u.get(r, 0.0) - v
        return u

    def admits(self, victim: RunningJob) -> bool:
        c = self.candidates[victim.job_id]
        tree = self.ctx.tree
        for path in c.protected:
            g = tree.guarantee(path)
            after = self._after(path, c.demand)
            for r, amount in g.items():
                if c.demand.get(r, 0.0) > 0 and self.demand.get(r, 0.0) > 0 and after.get(r, 0.0) + EPS < amount:
                    return False
        if c.fair_only and c.sides is not None:
            mine, theirs = c.sides
            cap = self.ctx.capacity
            before = dict(self.ctx.usage.get(mine))
            for r, v in self.demand.items():
                before[r] = before.get(r, 0.0) + v
            threshold = tree.fair_sharing.threshold
            if borrowing_share(tree, mine, before, cap) + threshold >= borrowing_share(
                    tree, theirs, self._after(theirs, c.demand), cap) - EPS:
                return False
        for path in tree.ancestors(c.queue):
            held = self.removed.setdefault(path, {})
            for r, v in c.demand.items():
                held[r] = held.get(r, 0.0) + v
        return True

    def valid(self, victims: list[RunningJob]) -> bool:
        self.reset()
        return all(self.admits(v) for v in victims)


def may_preempt(ctx: CycleContext, record: JobRecord, lowest_running: int | None, excess: list[Excess]) -> bool:
    """A cheap test before looking for victims: could anything be eligible at all? Not before the job has
    waited its class's preemption delay."""
    if record.nominated_at is not None:
        return True
    if preemption_delay_left(ctx.tree, record, ctx.state.now) > 0:
        return False
    if excess:
        return True
    if selector_pool(record) in {rule.lend for rule in ctx.tide_states}:
        return True
    if lowest_running is not None and lowest_running < PRIORITY_VALUES[record.spec.metadata.priority_class]:
        return True
    tree = ctx.tree
    if tree.fair_sharing.enabled and len(tree.queues) > 2:
        return True
    demand = job_demand(record.spec)
    return any(within_guarantee(tree.guarantee(p), ctx.usage.get(p), demand)
               for p in tree.ancestors(tree.resolve(record.spec.metadata.queue)))


def preemption_delay_left(tree: QueueTree, record: JobRecord, now: float) -> float:
    """Seconds until a pending job may preempt: its class's ``preemption_delay`` after it was last queued."""
    since = record.queued_at if record.queued_at is not None else record.submitted_at
    return max(0.0, since + tree.class_policy(record.spec.metadata.priority_class.value).preemption_delay - now)


def preempt_for(ctx: CycleContext, record: JobRecord, exclude: set[str], feedback: FamilyWeights | None,
                excess: list[Excess]) -> bool:
    """Plan the cheapest whole set of victims that lets ``record`` fit (and brings its queues within their
    limits); True when planned, or when its earlier victims are still stopping."""
    state, tree, now = ctx.state, ctx.tree, ctx.state.now
    if record.nominated_at is not None and now - record.nominated_at < state.preemption_timeout_s:
        return True
    cluster = ctx.cluster
    priority = PRIORITY_VALUES[record.spec.metadata.priority_class]
    queue = tree.resolve(record.spec.metadata.queue)
    demand = job_demand(record.spec)
    request = pod_request(record.spec, feedback, int(cluster.gpu_mem_cap.max()) if cluster.num_nodes else 0)
    require, prefer = topology_levels(record.spec, feedback)
    # feasibility only grows with the free capacity and shrinks with the request (see FailedSearches)
    monotone = ctx.failed is not None and request.kind != "mig" and (require is None or require >= Level.NUMA)
    search = (priority, queue, selector_pool(record), record.spec.spec.gang_size, require, prefer, monotone,
              record.job_id if record.job_id in ctx.running else None, tuple((e.path, e.resource) for e in excess))
    if ctx.failed is not None and ctx.failed.covers(search, request, exclude):
        return False
    found = candidates_for(ctx, record, queue, priority, demand)
    if not found:
        if ctx.failed is not None:
            ctx.failed.add(search, request, exclude)
        return False
    pool, reasons = found
    # Victims are sought on the cluster as labelled, not on its lent view: room freed on a node lent for a tidal
    # window goes back with the node when the window closes, so a preemptor placed there is evicted again and
    # both lose their work (a borrower there still runs on free room; the replay lost 79 GPU-h to preemption in
    # 16.5 h with the lent view, 56 without: docs/benchmarks.md). One copy; trials are undone.
    what_if = cluster.copy()

    def fits_without(victims: list[RunningJob]) -> bool:
        for e in excess:
            freed = sum(reasons[v.job_id].demand.get(e.resource, 0.0) for v in victims
                        if e.path in tree.ancestors(reasons[v.job_id].queue))
            if freed + EPS < e.amount:
                return False
        return _fits_after_release(what_if, ctx, victims, record, exclude, feedback)

    victims = select_victims(pool, fits_without, QueueGuard(ctx, demand, reasons), monotone=monotone)
    if not victims:
        if ctx.failed is not None:
            ctx.failed.add(search, request, exclude)
        return False
    whole = {v.job_id for v in victims if not reasons[v.job_id].extra}
    names = []
    for v in victims:
        c = reasons[v.job_id]
        if c.extra:  # one elastic extra pod: the job keeps running on the rest
            job_id, index = c.job_id, c.pod
            if job_id in whole:
                continue
            held, allocs = ctx.running[job_id]
            allocs = list(allocs)
            allocs.remove(ctx.state.extra_allocs[job_id][index])  # its GPUs stay taken until it is gone
            ctx.running[job_id] = (held, allocs)
            ctx.plan.preemptions.append(Preemption(job_id, record.job_id, c.why, (index,)))
            names.append(f"{job_id} pod {index}")
            continue
        victim, _ = ctx.running.pop(v.job_id)  # its GPUs stay taken until its pods are gone
        ctx.plan.preemptions.append(Preemption(v.job_id, record.job_id, c.why))
        ctx.usage.release(victim.spec.metadata.queue, c.demand)
        names.append(v.job_id)
    ctx.usage.admit(record.spec.metadata.queue, demand)  # the preemptor holds its queue's share from now on
    whys = sorted({reasons[v.job_id].why for v in victims})
    ctx.plan.nominations[record.job_id] = f"preempting {', '.join(names)} ({'; '.join(whys)})"
    ctx.changed()
    return True


def _fits_after_release(what_if: Cluster, ctx: CycleContext, victims: list[RunningJob], record: JobRecord,
                        exclude: set[str], feedback: FamilyWeights | None) -> bool:
    """Does ``record`` fit once ``victims`` are gone? Released on ``what_if`` and allocated back after."""
    allocs = victim_allocs(ctx, victims)
    for a in allocs:
        what_if.release(a)
    try:
        return not isinstance(place_job(ctx.placer, what_if, record.spec, ctx.state.nodes, exclude, feedback), Unfit)
    finally:
        for a in reversed(allocs):
            what_if.allocate(a)


def victim_allocs(ctx: CycleContext, victims: list[RunningJob]) -> list[Allocation]:
    """The allocations the victims free: a whole job's (extras included), an extra pod's own."""
    whole = {v.job_id for v in victims if "#" not in v.job_id}
    out = []
    for v in victims:
        job_id, _, pod = v.job_id.partition("#")
        if not pod:
            out.extend(ctx.running[job_id][1])
        elif job_id not in whole:
            out.append(ctx.state.extra_allocs[job_id][int(pod)])
    return out


def candidates_for(ctx: CycleContext, record: JobRecord, queue: str, priority: int, demand: Mapping[str, float]
                   ) -> tuple[list[RunningJob], dict[str, Candidate]] | None:
    """The running jobs ``record`` may evict, each with why (see the module docstring), and the elastic
    extra pods of running jobs (``<job>#<pod index>``, the first victims, whatever their minimum runtime)."""
    tree, now = ctx.tree, ctx.state.now
    reclaim_sides: dict[str, bool] = {}
    out: list[RunningJob] = []
    reasons: dict[str, Candidate] = {}
    for job_id, (victim, allocs) in ctx.running.items():
        if victim.state != JobState.RUNNING or job_id == record.job_id or not job_preemptible(tree, victim.spec):
            continue
        v_priority = PRIORITY_VALUES[victim.spec.metadata.priority_class]
        v_queue = tree.resolve(victim.spec.metadata.queue)
        started = victim.started_at if victim.started_at is not None else now
        weight = tree.spec(v_queue).weight
        c = _eligible(ctx, record, queue, priority, demand, victim, allocs, now - started, reclaim_sides)
        if c is not None:
            reasons[job_id] = c
            out.append(RunningJob(
                job_id=job_id, queue=v_queue, priority=v_priority, gpus=c.demand["gpu"],
                work_lost_s=now - max(started, victim.last_checkpoint_at or 0.0),
                borrowed=_slack(ctx, c), weight=weight,
            ))
        extras = ctx.state.extra_allocs.get(job_id, {})
        stopping = {p.index for p in victim.pods if p.stopping}
        live = [(i, a) for i, a in sorted(extras.items())
                if i >= victim.spec.spec.gang_size and i not in stopping and a in allocs]
        if not live:
            continue
        e = c or _eligible(ctx, record, queue, priority, demand, victim, allocs, math.inf, reclaim_sides)
        if e is None:
            continue
        for index, alloc in live:
            key = f"{job_id}#{index}"
            reasons[key] = Candidate(v_queue, {}, (), False, None, e.why, extra=True, job_id=job_id, pod=index)
            out.append(RunningJob(job_id=key, queue=v_queue, priority=v_priority, gpus=sum(alloc.gpu_milli) / 1000,
                                  work_lost_s=0.0, borrowed=_slack(ctx, e), weight=weight, extra=True))
    return (out, reasons) if out else None


def _eligible(ctx: CycleContext, record: JobRecord, queue: str, priority: int, demand: Mapping[str, float],
              victim: JobRecord, allocs: list[Allocation], ran: float, reclaim_sides: dict[str, bool]
              ) -> Candidate | None:
    """Why ``record`` may evict the running job ``victim`` that ran ``ran`` seconds, or None."""
    tree, cluster = ctx.tree, ctx.cluster
    pool = selector_pool(record)
    cls = record.spec.metadata.priority_class.value
    cap = tree.class_policy(cls).min_runtime
    v_priority = PRIORITY_VALUES[victim.spec.metadata.priority_class]
    v_queue = tree.resolve(victim.spec.metadata.queue)
    best_effort = victim.spec.metadata.priority_class == PriorityClass.BEST_EFFORT
    mr_priority = 0.0 if best_effort else tree.victim_min_runtime(v_queue, False, ctx.state.min_runtime_s)
    if cap is not None:
        mr_priority = min(mr_priority, cap)
    mr_reclaim = 0.0 if best_effort else tree.victim_min_runtime(v_queue, True, ctx.state.min_runtime_s)
    by_priority = v_priority < priority and ran >= mr_priority
    by_tide = ran >= mr_reclaim and any(pool == rule.lend and borrows_from(victim, allocs, rule, cluster)
                                        for rule in ctx.tide_states)
    sides = tree.split(queue, v_queue)
    v_demand = job_demand(victim.spec)
    if by_tide or (sides is None and by_priority):
        why = "its pool takes its lent nodes back" if by_tide else f"priority {cls}"
        return Candidate(v_queue, v_demand, (), False, None, why)
    if sides is None:
        return None
    mine, theirs = sides
    if mine not in reclaim_sides:
        reclaim_sides[mine] = within_guarantee(tree.guarantee(mine), ctx.usage.get(mine), demand)
    by_guarantee = reclaim_sides[mine] and ran >= mr_reclaim
    by_fair = tree.fair_sharing.enabled and v_priority <= priority and ran >= mr_reclaim
    if not (by_priority or by_guarantee or by_fair):
        return None
    why = (f"priority {cls}" if by_priority else "reclaiming its queue's guarantee" if by_guarantee
           else "fair-share reclaim")
    return Candidate(v_queue, v_demand, tuple(tree.path_between(v_queue, theirs)),
                     not (by_priority or by_guarantee), sides, why)


def _slack(ctx: CycleContext, c: Candidate) -> float:
    """GPUs the victim's queue holds beyond what protects it (its usage where nothing does)."""
    levels = c.protected or (c.queue,)
    slack = None
    for path in levels:
        g = ctx.tree.guarantee(path).get("gpu", 0.0)
        if g > 0:
            over = ctx.usage.get(path).get("gpu", 0.0) - g
            slack = over if slack is None else min(slack, over)
    return max(0.0, ctx.usage.get(c.queue).get("gpu", 0.0) if slack is None else slack)


def deterministic(placer: Placer) -> bool:
    """Does a placement depend only on the cluster and the request (no random draws)?"""
    return placer.tie_break == "first" and not placer.weights.get("random")


class FailedSearches:
    """The victim searches of one cycle that found nothing, to skip the searches that cannot do better.

    Valid while the cluster, the running jobs and the queues' usage stay as the failed searches saw
    them: ``changed`` (every bind or planned preemption) forgets them all. A search for a job is
    skipped when one for an earlier job failed with the same *search key* (priority, resolved queue,
    pool selector: so the same candidates, the same borrowing and the same reclaim; gang size and
    topology needs; the limits it exceeds) and the job asks for no less:

    - always when the pod request and the excluded nodes are equal (the search is a function of them);
    - for a ``monotone`` key (not MIG, no topology requirement finer than a NUMA node), also when every
      amount (CPU, memory, GPUs, milli-GPU, GPU memory) is at least the failed one's and at least its
      nodes are excluded. Whether such a job fits a cluster is a set of thresholds on free amounts
      (``node_filter``, whole-free and share-free GPUs; for a gang ``place_gang`` finds a plan exactly
      when some allowed domain's summed pod capacity reaches the gang size, and a capacity only
      shrinks as the request grows), so whatever what-if cluster lets the larger job fit lets the
      smaller one fit too. The guarantee and fair-share rules only get stricter as the demand grows.
    """

    AMOUNTS = ("cpu_milli", "memory_mib", "gpu_count", "gpu_milli", "gpu_mem_mib")

    def __init__(self) -> None:
        self._failed: dict[tuple[Any, ...], list[tuple[PodRequest, tuple[int, ...], frozenset[str]]]] = {}

    def changed(self) -> None:
        self._failed.clear()

    def add(self, search: tuple[Any, ...], request: PodRequest, exclude: set[str]) -> None:
        amounts = tuple(getattr(request, a) for a in self.AMOUNTS)
        self._failed.setdefault(self._key(search, request), []).append((request, amounts, frozenset(exclude)))

    def covers(self, search: tuple[Any, ...], request: PodRequest, exclude: set[str]) -> bool:
        entries = self._failed.get(self._key(search, request))
        if not entries:
            return False
        monotone = search[6]
        amounts = tuple(getattr(request, a) for a in self.AMOUNTS)
        for req, done, excluded in entries:
            if monotone:
                if all(a >= b for a, b in zip(amounts, done, strict=True)) and excluded <= exclude:
                    return True
            elif req == request and excluded == exclude:
                return True
        return False

    @staticmethod
    def _key(search: tuple[Any, ...], request: PodRequest) -> tuple[Any, ...]:
        return (*search, request.kind, request.mig_profile, request.gpu_models, request.node_selector)
