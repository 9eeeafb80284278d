"""One scheduling cycle as a pure function: a snapshot in, a plan out.

The live placer and ``tide sim replay`` both call ``plan_cycle``; they differ only in how they
gather the snapshot and carry out the plan (Redis + node agents, or a virtual clock). Steps:

1. tides: outside an open window, borrowed work on lent nodes is to be preempted;
2. order the pending jobs (``queues.order_pending``: nominated, guarantees, weighted DRF, priority, age);
3. for each: queue limits; nodes it may not use (lost, failed before, earmarked for a gang unless it is
   preemptible or its declared runtime ends in time); place it whole on its view of the cluster (tides
   relabel lent nodes); the plan assumes each bind succeeds and places the next job on what is left;
4. a job that does not fit may preempt (priority, reclaim of borrowed guarantee, a pool taking its lent
   nodes back): the core picks the cheapest whole victims;
5. otherwise the first blocked gang earmarks nodes (the backfill rule) and the job stays pending with why;
6. tides: in an open window, a lending pool whose own jobs used up its headroom takes lent nodes back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tide.core.cluster import Cluster
from tide.core.job_placement import (
    PodPlacement,
    earmark,
    is_preemptible,
    job_demand,
    place_job,
    pod_request,
    topology_levels,
)
from tide.core.model import MILLI, Allocation, PodRequest, Unfit
from tide.core.placer import Placer
from tide.core.queues import (
    PendingJob,
    QueueTree,
    RunningJob,
    add,
    below_guarantee,
    order_pending,
    over_guarantee,
    select_victims,
    usage_tree,
    within_limits,
)
from tide.core.tides import TideRule, TideState
from tide.core.topology import Level
from tide.schemas.events import JobRecord, JobState
from tide.schemas.feedback import FamilyWeights, family_of
from tide.schemas.job import PRIORITY_VALUES, PriorityClass
from tide.schemas.node import NodeDescription

Running = dict[str, tuple[JobRecord, list[Allocation]]]


@dataclass
class CycleState:
    """What the planner sees: the cluster with every claim applied, and the jobs."""

    nodes: list[NodeDescription]
    cluster: Cluster
    pending: list[JobRecord]  # placeable jobs (pending or unschedulable, not cancelled), any order
    running: Running  # every job holding claims, with its allocations
    tree: QueueTree = field(default_factory=lambda: QueueTree.from_config(None))
    tides: list[TideRule] = field(default_factory=list)
    weights: Mapping[str, FamilyWeights] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    now: float = 0.0  # seconds (the placer: time.time(); the replay: its virtual clock)
    wall: datetime | None = None  # time of day for tides
    min_runtime_s: float = 60.0
    preemption_timeout_s: float = 120.0


@dataclass(frozen=True)
class Bind:
    record: JobRecord
    placements: list[PodPlacement]
    feedback: FamilyWeights | None = None


@dataclass(frozen=True)
class Preemption:
    job_id: str
    by: str
    why: str


@dataclass
class Plan:
    binds: list[Bind] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    nominations: dict[str, str] = field(default_factory=dict)  # preemptor -> reason
    not_placed: list[tuple[JobRecord, Unfit]] = field(default_factory=list)


def plan_cycle(state: CycleState, placer: Placer) -> Plan:
    plan = Plan()
    cluster = state.cluster.copy()
    running: Running = dict(state.running)
    tide_states = {rule: rule.state(state.wall) for rule in state.tides} if state.wall else {}
    for rule, tide in tide_states.items():
        if tide == TideState.OPEN:
            continue
        for job_id, (record, allocs) in list(running.items()):
            if record.state == JobState.RUNNING and borrows_from(record, allocs, rule, cluster):
                plan.preemptions.append(Preemption(job_id, "tide", f"tidal window {tide}: {rule.lend} nodes go back"))
                running.pop(job_id)
    if state.pending and state.nodes:
        _place_pending(state, placer, plan, cluster, running, tide_states)
    refill_headroom(plan, cluster, running, tide_states)
    return plan


def _place_pending(state: CycleState, placer: Placer, plan: Plan, cluster: Cluster, running: Running,
                   tide_states: Mapping[TideRule, TideState]) -> None:
    """Steps 2-5: place the pending jobs in order on ``cluster``, planning preemptions where allowed."""
    tree = state.tree
    capacity = {
        "gpu": float(cluster.gpu_exists.sum()),
        "cpu": float(cluster.cpu_cap.sum()),
        "memory": float(cluster.mem_cap.sum()),
    }
    usage = usage_tree(tree, [(r.spec.metadata.queue, job_demand(r.spec)) for r, _ in running.values()])
    records = {r.job_id: r for r in state.pending if r.not_before <= state.now}
    order = order_pending(tree, [
        PendingJob(r.job_id, r.spec.metadata.queue, PRIORITY_VALUES[r.spec.metadata.priority_class],
                   r.submitted_at, job_demand(r.spec), nominated=r.nominated_at is not None)
        for r in records.values()
    ], usage, capacity)
    earmarked: list[str] = []
    lend_pools = {rule.lend for rule in tide_states}
    # the shortcuts skip what-ifs: only where a skipped placement cannot change the placer's state
    failed = FailedSearches() if deterministic(placer) else None
    lowest = min((PRIORITY_VALUES[r.spec.metadata.priority_class] for r, _ in running.values()), default=None)
    for pending in order:
        record = records[pending.job_id]
        over = within_limits(tree, record.spec.metadata.queue, pending.demand, usage)
        if over:
            plan.not_placed.append((record, Unfit(over, True)))
            continue
        exclude = state.lost | set(record.avoid_nodes)
        if not is_preemptible(record.spec) and not fits_before(record, earmarked, running, state.now):
            exclude |= set(earmarked)
        view = lent_view(cluster, record, tide_states, running)
        feedback = state.weights.get(family_of(record.spec))
        result = place_job(placer, view, record.spec, state.nodes, exclude, feedback)
        if isinstance(result, Unfit):
            if result.resolvable and _may_preempt(state, record, lowest, usage, lend_pools) and _preempt_for(
                    state, placer, plan, record, cluster, running, usage, exclude, tide_states, feedback, failed):
                if failed is not None:
                    failed.changed()  # victims planned: the running jobs and the usage changed
                continue
            reason = result.reason
            if result.resolvable and not earmarked and record.spec.spec.gang_size > 1:
                earmarked = earmark(cluster, record.spec)
                marked = set(earmarked)
                blocking = [r for r, allocs in running.values() if any(a.node_id in marked for a in allocs)]
                preemptible = sum(is_preemptible(r.spec) for r in blocking)
                reason += (f"; earmarked {len(earmarked)} node(s) so it is not starved: it fits there once the "
                           f"{len(blocking)} job(s) on them end ({preemptible} of them preemptible)")
            plan.not_placed.append((record, Unfit(reason, result.resolvable)))
            continue
        plan.binds.append(Bind(record, result, feedback))
        if failed is not None:
            failed.changed()
        for p in result:
            placer.observe(pod_request(record.spec))
            cluster.allocate(p.alloc)
        running[record.job_id] = (record, [p.alloc for p in result])
        for path in tree.ancestors(tree.resolve(record.spec.metadata.queue)):
            usage[path] = add(usage.get(path, {}), pending.demand)


def _may_preempt(state: CycleState, record: JobRecord, lowest_running: int | None,
                 usage: dict[str, dict[str, float]], lend_pools: set[str]) -> bool:
    """A cheap test before looking for victims: does anything run below it, or is it owed capacity?"""
    if record.nominated_at is not None:
        return True
    priority = PRIORITY_VALUES[record.spec.metadata.priority_class]
    if selector_pool(record) in lend_pools:
        return True
    queue = state.tree.resolve(record.spec.metadata.queue)
    if below_guarantee(state.tree.spec(queue), usage.get(queue, {})):
        return True
    return lowest_running is not None and lowest_running < priority


def _preempt_for(
    state: CycleState,
    placer: Placer,
    plan: Plan,
    record: JobRecord,
    cluster: Cluster,
    running: Running,
    usage: dict[str, dict[str, float]],
    exclude: set[str],
    tide_states: Mapping[TideRule, TideState],
    feedback: FamilyWeights | None,
    failed: FailedSearches | None = None,
) -> bool:
    """Plan the cheapest whole set of victims that lets ``record`` fit; True when planned (or still waiting)."""
    now = state.now
    if record.nominated_at is not None and now - record.nominated_at < state.preemption_timeout_s:
        return True  # its victims are still stopping
    tree = state.tree
    priority = PRIORITY_VALUES[record.spec.metadata.priority_class]
    queue = tree.resolve(record.spec.metadata.queue)
    request = pod_request(record.spec, feedback, int(cluster.gpu_mem_cap.max()) if cluster.num_nodes else 0)
    require, prefer = topology_levels(record.spec, feedback)
    # feasibility only grows with the free capacity and shrinks with the request (see FailedSearches)
    monotone = failed is not None and request.kind != "mig" and (require is None or require >= Level.NUMA)
    search = (priority, queue, selector_pool(record), record.spec.spec.gang_size, require, prefer, monotone,
              record.job_id if record.job_id in running else None)
    if failed is not None and failed.covers(search, request, exclude):
        return False
    reclaim = below_guarantee(tree.spec(queue), usage.get(queue, {}))
    borrowed: dict[str, float] = {}
    candidates: list[RunningJob] = []
    for job_id, (victim, allocs) in running.items():
        if victim.state != JobState.RUNNING or job_id == record.job_id:
            continue
        v_priority = PRIORITY_VALUES[victim.spec.metadata.priority_class]
        v_queue = tree.resolve(victim.spec.metadata.queue)
        over = over_guarantee(tree.spec(v_queue), usage.get(v_queue, {}))
        if over > 0:
            borrowed[v_queue] = over
        by_priority = v_priority < priority
        by_reclaim = reclaim and v_queue != queue and over > 0 and v_priority <= priority
        # a pool takes its lent nodes back when its own work needs them
        by_tide = any(selector_pool(record) == rule.lend and borrows_from(victim, allocs, rule, cluster)
                      for rule in tide_states)
        if not (by_priority or by_reclaim or by_tide):
            continue
        started = victim.started_at if victim.started_at is not None else now
        candidates.append(RunningJob(
            job_id=job_id,
            queue=v_queue,
            priority=v_priority,
            gpus=job_demand(victim.spec)["gpu"],
            work_lost_s=now - max(started, victim.last_checkpoint_at or 0.0),
            preemptible=victim.spec.metadata.priority_class == PriorityClass.BEST_EFFORT
            or now - started >= state.min_runtime_s,
        ))
    if not candidates:
        if failed is not None:
            failed.add(search, request, exclude)
        return False

    def fits_without(victims: list[RunningJob]) -> bool:
        what_if = cluster.copy()
        for v in victims:
            for alloc in running[v.job_id][1]:
                what_if.release(alloc)
        return not isinstance(place_job(placer, what_if, record.spec, state.nodes, exclude, feedback), Unfit)

    only_reclaim = all(PRIORITY_VALUES[running[c.job_id][0].spec.metadata.priority_class] >= priority
                       for c in candidates)
    victims = select_victims(candidates, fits_without, borrowed, protect_guarantee=only_reclaim, monotone=monotone)
    if not victims:
        if failed is not None:
            failed.add(search, request, exclude)
        return False
    why = "reclaiming its queue's guarantee" if only_reclaim else f"priority {record.spec.metadata.priority_class}"
    for v in victims:
        plan.preemptions.append(Preemption(v.job_id, record.job_id, why))
        victim, _ = running.pop(v.job_id)  # its GPUs stay taken until its pods are gone
        for path in tree.ancestors(tree.resolve(victim.spec.metadata.queue)):
            usage[path] = add(usage.get(path, {}), job_demand(victim.spec), -1.0)
    plan.nominations[record.job_id] = f"preempting {', '.join(v.job_id for v in victims)} ({why})"
    return True


def deterministic(placer: Placer) -> bool:
    """Does a placement depend only on the cluster and the request (no random draws)?"""
    return placer.tie_break == "first" and not placer.weights.get("random")


class FailedSearches:
    """The victim searches of one cycle that found nothing, to skip the searches that cannot do better.

    Valid while the cluster, the running jobs and the queues' usage stay as the failed searches saw
    them: ``changed`` (every bind or planned preemption) forgets them all. A search for a job is
    skipped when one for an earlier job failed with the same *search key* (priority, resolved queue,
    pool selector: so the same candidates, the same borrowing and the same reclaim; gang size and
    topology needs) and the job asks for no less:

    - always when the pod request and the excluded nodes are equal (the search is a function of them);
    - for a ``monotone`` key (not MIG, no topology requirement finer than a NUMA node), also when every
      amount (CPU, memory, GPUs, milli-GPU, GPU memory) is at least the failed one's and at least its
      nodes are excluded. Whether such a job fits a cluster is a set of thresholds on free amounts
      (``node_filter``, whole-free and share-free GPUs; for a gang ``place_gang`` finds a plan exactly
      when some allowed domain's summed pod capacity reaches the gang size, and a capacity only
      shrinks as the request grows), so whatever what-if cluster lets the larger job fit lets the
      smaller one fit too. ``select_victims`` tries the same victim sets for both (they depend on the
      candidates and the borrowing only until something fits), and the smaller one fitted none.
    """

    AMOUNTS = ("cpu_milli", "memory_mib", "gpu_count", "gpu_milli", "gpu_mem_mib")

    def __init__(self) -> None:
        self._failed: dict[tuple, list[tuple[PodRequest, tuple[int, ...], frozenset[str]]]] = {}

    def changed(self) -> None:
        self._failed.clear()

    def add(self, search: tuple, request: PodRequest, exclude: set[str]) -> None:
        amounts = tuple(getattr(request, a) for a in self.AMOUNTS)
        self._failed.setdefault(self._key(search, request), []).append((request, amounts, frozenset(exclude)))

    def covers(self, search: tuple, request: PodRequest, exclude: set[str]) -> bool:
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
    def _key(search: tuple, request: PodRequest) -> tuple:
        return (*search, request.kind, request.mig_profile, request.gpu_models, request.node_selector)


def selector_pool(record: JobRecord) -> str | None:
    return record.spec.spec.template.node_selector.get("pool")


def borrows_from(record: JobRecord, allocs: Iterable[Allocation], rule: TideRule, cluster: Cluster) -> bool:
    """Does this job run on nodes that ``rule`` lends to its pool?"""
    if selector_pool(record) != rule.to:
        return False
    return any(cluster.labels[cluster.index[a.node_id]].get("pool") == rule.lend
               for a in allocs if a.node_id in cluster.index)


def lent_view(cluster: Cluster, record: JobRecord, tide_states: Mapping[TideRule, TideState],
              running: Running) -> Cluster:
    """The cluster as ``record`` may see it: in an open window, the lent nodes (``lending``) carry the
    borrowing pool's label."""
    pool = selector_pool(record)
    rules = [r for r, s in tide_states.items() if s == TideState.OPEN and r.to == pool]
    if not rules:
        return cluster
    view = cluster.copy()
    view.labels = [dict(labels) for labels in cluster.labels]
    view._label_cache = {}
    for rule in rules:
        for i in lending(cluster, rule, running).lent:
            view.labels[i]["pool"] = rule.to
    return view


@dataclass(frozen=True)
class Lending:
    """What a tide rule lends now: ``lent`` node indices, and the lending pool's ``headroom``, the whole
    GPUs its own jobs can use outside the lent nodes (free now or once stopping borrowers are gone)."""

    lent: list[int]
    headroom: int
    borrowed: dict[int, list[str]]  # lent node -> the running borrowers on it (the headroom's refill)


def lending(cluster: Cluster, rule: TideRule, running: Running) -> Lending:
    """The lending pool's nodes in an open window. A node with work of its own pool is never lent; a
    node with a borrower still running stays lent; the other (idle) nodes are lent, except the
    smallest ones (last in node order among equals) that bring the headroom up to ``keep_gpus``."""
    pool_nodes = [i for i, labels in enumerate(cluster.labels) if labels.get("pool") == rule.lend]
    if not pool_nodes:
        return Lending([], 0, {})
    own: set[str] = set()
    borrowers: dict[str, list[str]] = {}
    for job_id, (other, allocs) in running.items():
        if selector_pool(other) != rule.to:
            own.update(a.node_id for a in allocs)
        elif other.state != JobState.PREEMPTED:  # a stopping borrower's GPUs are coming back
            for a in allocs:
                borrowers.setdefault(a.node_id, []).append(job_id)
    whole_free = (cluster.milli_free >= MILLI) & cluster.gpu_exists
    headroom, lent, idle = 0, [], []
    borrowed: dict[int, list[str]] = {}
    for i in pool_nodes:
        node_id = cluster.node_ids[i]
        if node_id in own:
            headroom += int(whole_free[i].sum())
        elif node_id in borrowers:
            lent.append(i)
            borrowed[i] = sorted(set(borrowers[node_id]))
        else:
            idle.append(i)
    for i in sorted(idle, key=lambda i: (int(cluster.gpu_exists[i].sum()), -i)):
        if headroom < rule.keep_gpus:
            headroom += int(cluster.gpu_exists[i].sum())
        else:
            lent.append(i)
    return Lending(sorted(lent), headroom, borrowed)


def refill_headroom(plan: Plan, cluster: Cluster, running: Running, tide_states: Mapping[TideRule, TideState]) -> None:
    """In an open window, when the lending pool's own jobs have used up its ``keep_gpus`` headroom,
    plan the return of lent nodes until it is restored, cheapest first (fewest GPUs of borrowers)."""
    for rule, tide in tide_states.items():
        if tide != TideState.OPEN or not rule.keep_gpus:
            continue
        while True:
            now = lending(cluster, rule, running)
            if now.headroom >= rule.keep_gpus:
                break
            # a job bound in this very plan has not started: it is not taken back before it does
            returnable = [i for i, jobs in now.borrowed.items()
                          if all(running[j][0].state == JobState.RUNNING for j in jobs)]
            if not returnable:
                break
            node = min(returnable, key=lambda i: (sum(job_demand(running[j][0].spec)["gpu"]
                                                      for j in now.borrowed[i]), i))
            for job_id in now.borrowed[node]:
                running.pop(job_id)
                plan.preemptions.append(Preemption(
                    job_id, "tide", f"tidal headroom: {rule.lend} keeps {rule.keep_gpus} GPU(s) for its own jobs"))


def fits_before(record: JobRecord, earmarked: list[str], running: Running, now: float) -> bool:
    """Backfill: may this job use the nodes earmarked for a waiting gang? Only if its declared runtime
    ends before every job now on those nodes is expected to end (so it cannot delay the gang)."""
    estimate = record.spec.spec.runtime_estimate_s
    if not earmarked or estimate is None:
        return False
    marked = set(earmarked)
    gang_start = now
    for other, allocs in running.values():
        if not any(a.node_id in marked for a in allocs):
            continue
        other_estimate = other.spec.spec.runtime_estimate_s
        if other_estimate is None:
            return False  # unknown end: the gang's start cannot be bounded, no backfill there
        gang_start = max(gang_start, (other.started_at if other.started_at is not None else now) + other_estimate)
    return now + estimate <= gang_start
