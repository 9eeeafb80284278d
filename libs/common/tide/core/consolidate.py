"""The consolidation action (pure): move running jobs so that a pending job that does not fit only because
the free GPUs are fragmented can start, without any job losing its place (KAI-Scheduler's consolidation).

The rule. A pending job that does not fit may move running jobs when all of these hold:

- a moved job is *movable*: running (not stopping), preemptible (not ``preemptible: false``, not of a
  class that is not), of the pending job's priority or lower, past its minimum runtime (the larger of its
  queue's, or the config's, ``minRuntime.priority`` and ``minRuntime.reclaim``; best-effort work has
  none, as in ``preempt``), at most ``MAX_WORK_LOST_S`` (10 min) past its start or last acknowledged
  checkpoint (a move restarts it from there: only cheap moves), and *checkpointable*. The job spec has
  no checkpoint flag (only the record's ``last_checkpoint_at``, what a job acknowledged), so a job
  counts as checkpointable when its class is ``best-effort`` or ``offline-training``: ``online-serving``
  is never moved. An elastic job (``replicas`` above ``minMember``) is not moved either: only its gang is
  sure to be placed again;
- on a what-if copy of the cluster, once the moved jobs' claims are released, the pending job fits, and
  then every moved job fits again on what is left (biggest first, each on its own view of the cluster,
  avoiding the nodes it may not use). So the work that runs does not shrink: nothing is evicted for good;
- at most ``max_moves`` jobs move for one pending job (``MAX_MOVES`` by default), and at most
  ``MAX_MOVES`` in one cycle in all (``CycleContext.moves_left``); a search that found nothing is not
  repeated for the same request until the cycle binds or evicts something;
- at most ``MAX_SEARCHES`` pending jobs are searched for in one cycle (``CycleContext.searches_left``):
  each search places the job and its moved jobs a few dozen times, and a saturated cluster has many
  blocked jobs;
- the pending job asks for whole GPUs (shares fit in the gaps that fragmentation leaves, and MIG
  slices are not consolidated) and the free GPUs of
  the cluster add up to what it asks: otherwise it is not a matter of fragmentation.

Among the sets found, the cheapest is kept: fewest GPUs moved, then least work lost (seconds since its
start or last checkpoint), then fewest jobs. The search is bounded: for each of at most ``MAX_STARTS``
start nodes (the nodes with the most free GPUs that could hold a pod of the pending job once their
movable jobs are gone), the movable jobs of that node come first (cheapest first), then those of the other
nodes (most free first); the shortest prefix that lets the pending job fit is taken (at most
``max_moves`` long), the moves it does not need are dropped again (last chosen first), and the set is
kept if the moved jobs fit again.

A plan is recorded as a preemption is (``preempt.preempt_for``), so the live placer and the replay carry
it out unchanged: each moved job is a ``Preemption`` by the pending job (``why`` starts with
"consolidation"), stops gracefully, requeues and is placed again by a later cycle; the pending job is
nominated and holds its queue's share from now on. A nominated job waits for its moved jobs like a
preemptor waits for its victims (``consolidate_for`` plans nothing for it within the preemption
timeout), and a moved job restarts its minimum runtime when it starts again, so it is not moved again at
once (best-effort work has none: like a preemption victim, it may be moved again by another pending job).

Worked example. Four nodes of 8 GPUs; on each, three movable 2-GPU jobs (6 used, 2 free: 8 GPUs free in
all, but no node whole). A pending 8-GPU whole-node job fits nowhere. Starting from n0, moving its three
jobs frees n0 (6 GPUs moved); in the what-if the pending job takes n0 and the three jobs take the 2 free
GPUs of n1, n2 and n3. With ``max_moves=2`` nothing is planned (each node needs 3 moves), nor when the
other nodes had no room for the moved jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from tide.core.backfill import may_use_earmarked
from tide.core.cluster import Cluster
from tide.core.cycle_context import CycleContext, Preemption
from tide.core.job_placement import PodPlacement, job_demand, place_job, pod_request, topology_levels
from tide.core.model import MILLI, Allocation, Unfit
from tide.core.preempt import job_preemptible
from tide.core.tidal import lent_view
from tide.schemas.events import JobRecord, JobState
from tide.schemas.feedback import FamilyWeights, weights_for
from tide.schemas.job import PRIORITY_VALUES, PriorityClass

MAX_MOVES = 4  # jobs moved for one pending job, at most
MAX_SEARCHES = 8  # pending jobs searched for in one cycle, at most
MAX_WORK_LOST_S = 600.0  # a job is moved only if it ran at most this long since its start or last checkpoint
MAX_STARTS = 8  # start nodes tried, at most
CHECKPOINTABLE_CLASSES = frozenset({PriorityClass.BEST_EFFORT, PriorityClass.OFFLINE_TRAINING})


@dataclass(frozen=True)
class Move:
    """A running job the plan moves: it stops, requeues and fits again on ``lands_on`` (in the what-if)."""

    job_id: str
    gpus: float
    work_lost_s: float
    lands_on: tuple[str, ...]


@dataclass(frozen=True)
class Movable:
    """A running job that may be moved, with its claims and what moving it costs."""

    record: JobRecord
    allocs: tuple[Allocation, ...]
    gpus: float
    work_lost_s: float

    @property
    def job_id(self) -> str:
        return self.record.job_id

    def cost(self) -> tuple[float, float, str]:
        return (self.gpus, self.work_lost_s, self.job_id)


def movable_jobs(ctx: CycleContext, record: JobRecord) -> list[Movable]:
    """The running jobs ``record`` may move (see the module docstring), cheapest first."""
    tree, now = ctx.tree, ctx.state.now
    priority = PRIORITY_VALUES[record.spec.metadata.priority_class]
    out: list[Movable] = []
    for job_id, (job, allocs) in ctx.running.items():
        cls = job.spec.metadata.priority_class
        elastic = job.spec.spec.replicas > job.spec.spec.gang_size  # its extra pods might not come back
        if (job.state != JobState.RUNNING or job_id == record.job_id or cls not in CHECKPOINTABLE_CLASSES
                or PRIORITY_VALUES[cls] > priority or elastic or not job_preemptible(tree, job.spec)):
            continue
        queue = tree.resolve(job.spec.metadata.queue)
        default = ctx.state.min_runtime_s
        min_runtime = 0.0 if cls == PriorityClass.BEST_EFFORT else max(
            tree.victim_min_runtime(queue, False, default), tree.victim_min_runtime(queue, True, default))
        started = job.started_at if job.started_at is not None else now
        if now - started < min_runtime:
            continue
        work_lost_s = now - max(started, job.last_checkpoint_at or 0.0)
        if work_lost_s > MAX_WORK_LOST_S:
            continue  # a move restarts it from its last checkpoint: only cheap moves are worth a start
        out.append(Movable(job, tuple(allocs), job_demand(job.spec)["gpu"], work_lost_s))
    return sorted(out, key=Movable.cost)


def consolidate_for(ctx: CycleContext, record: JobRecord, exclude: set[str], feedback: FamilyWeights | None,
                    max_moves: int = MAX_MOVES) -> list[Move] | None:
    """Plan the cheapest moves (at most ``max_moves``) after which ``record`` fits and every moved job fits
    again; record them in ``ctx`` as preemptions by ``record`` and nominate it. None: nothing planned."""
    state = ctx.state
    if not ctx.tree.consolidation:
        return None  # opt-in: ``consolidation: {enabled: true}`` in the queue config
    max_moves = min(max_moves, ctx.moves_left)
    if max_moves <= 0 or record.job_id in ctx.running:
        return None
    if record.nominated_at is not None and state.now - record.nominated_at < state.preemption_timeout_s:
        return None  # it still waits for the jobs it moved or evicted
    demand = job_demand(record.spec)
    cluster = ctx.cluster
    request = pod_request(record.spec, feedback)
    if request.gpu_count < 1:
        return None  # only whole GPUs are consolidated
    if cluster.milli_free[cluster.gpu_exists].sum() < demand["gpu"] * MILLI:
        return None  # not a matter of fragmentation: the free GPUs are too few in all
    # a search that found nothing finds nothing for the same request until the cycle changes something
    search = (request, record.spec.spec.gang_size, record.spec.metadata.priority_class,
              topology_levels(record.spec, feedback), frozenset(record.avoid_nodes), frozenset(exclude), max_moves)
    if search in ctx.consolidation_failed or ctx.searches_left <= 0:
        return None
    ctx.searches_left -= 1
    candidates = movable_jobs(ctx, record)
    if not candidates:
        ctx.consolidation_failed.add(search)
        return None
    what_if = cluster.copy()  # one copy; every trial is undone
    if not isinstance(_place_after_moving(ctx, what_if, record, [], exclude, feedback), Unfit):
        return None  # it fits as it is: nothing to move
    best: list[Move] | None = None
    tried: set[frozenset[str]] = set()
    for start in _start_nodes(what_if, record, candidates, exclude):
        chosen = _shortest_fitting(ctx, what_if, record, exclude, feedback, _sequence(what_if, candidates, start),
                                   max_moves)
        if chosen is None or frozenset(m.job_id for m in chosen) in tried:
            continue
        tried.add(frozenset(m.job_id for m in chosen))
        moves = _moved_jobs_fit_again(ctx, what_if, record, chosen, exclude, feedback)
        if moves is not None and (best is None or _cost(moves) < _cost(best)):
            best = moves
    if best is None:
        ctx.consolidation_failed.add(search)
        return None
    ctx.moves_left -= len(best)
    _record_moves(ctx, record, best)
    return best


def _cost(moves: list[Move]) -> tuple[float, float, int, list[str]]:
    return (sum(m.gpus for m in moves), sum(m.work_lost_s for m in moves), len(moves), sorted(m.job_id for m in moves))


def _node_gpus_milli(allocs: tuple[Allocation, ...], node_id: str) -> int:
    return sum(sum(a.gpu_milli) for a in allocs if a.node_id == node_id)


def _start_nodes(cluster: Cluster, record: JobRecord, candidates: list[Movable], exclude: set[str]) -> list[str]:
    """The nodes to clear first: those ``record`` may use that could hold a pod of it once their movable
    jobs are gone, most free first, at most ``MAX_STARTS``."""
    request = pod_request(record.spec)
    pod_milli = request.gpu_count * MILLI + request.gpu_milli
    movable_milli: dict[str, int] = {}
    for c in candidates:
        for node_id in {a.node_id for a in c.allocs}:
            movable_milli[node_id] = movable_milli.get(node_id, 0) + _node_gpus_milli(c.allocs, node_id)
    free = {node_id: int(cluster.milli_free[i][cluster.gpu_exists[i]].sum()) for node_id, i in cluster.index.items()}
    useful = [n for n, moved in movable_milli.items()
              if n in free and n not in exclude and free[n] + moved >= pod_milli]
    return sorted(useful, key=lambda n: (-free[n], n))[:MAX_STARTS]


def _sequence(cluster: Cluster, candidates: list[Movable], start: str) -> list[Movable]:
    """The movable jobs on ``start`` (cheapest first), then those on the other nodes, most free first."""
    free = {node_id: int(cluster.milli_free[i][cluster.gpu_exists[i]].sum()) for node_id, i in cluster.index.items()}

    def node_rank(c: Movable) -> tuple[bool, int, str]:
        on_start = any(a.node_id == start for a in c.allocs)
        most_free = max(c.allocs, key=lambda a: (free.get(a.node_id, 0), a.node_id)).node_id if c.allocs else ""
        return (not on_start, -free.get(most_free, 0), most_free)

    return sorted(candidates, key=lambda c: (*node_rank(c), *c.cost()))


def _shortest_fitting(ctx: CycleContext, what_if: Cluster, record: JobRecord, exclude: set[str],
                      feedback: FamilyWeights | None, sequence: list[Movable], max_moves: int) -> list[Movable] | None:
    """The shortest prefix of ``sequence`` (at most ``max_moves``) after which ``record`` fits, without
    the moves it does not need; None if none."""

    def fits(moved: list[Movable]) -> bool:
        return not isinstance(_place_after_moving(ctx, what_if, record, moved, exclude, feedback), Unfit)

    chosen: list[Movable] = []
    for c in sequence[:max_moves]:
        chosen.append(c)
        if fits(chosen):
            break
    else:
        return None
    for move in reversed(list(chosen)):
        trial = [c for c in chosen if c is not move]
        if trial and fits(trial):
            chosen = trial
    return chosen


def _place_after_moving(ctx: CycleContext, what_if: Cluster, record: JobRecord, moved: list[Movable],
                        exclude: set[str], feedback: FamilyWeights | None) -> list[PodPlacement] | Unfit:
    """Where ``record`` goes once ``moved`` are gone (released on ``what_if`` and allocated back after)."""
    allocs = [a for m in moved for a in m.allocs]
    for a in allocs:
        what_if.release(a)
    try:
        view = lent_view(what_if, record, ctx.tide_states, ctx.running)
        return place_job(ctx.placer, view, record.spec, ctx.state.nodes, exclude, feedback)
    finally:
        for a in reversed(allocs):
            what_if.allocate(a)


def _moved_jobs_fit_again(ctx: CycleContext, what_if: Cluster, record: JobRecord, moved: list[Movable],
                          exclude: set[str], feedback: FamilyWeights | None) -> list[Move] | None:
    """The moves, if ``record`` fits once ``moved`` are gone and then each moved job fits again on what is
    left (biggest first); None otherwise. ``what_if`` is left as it was."""
    state = ctx.state
    taken: list[Allocation] = []  # allocated on what_if, to give back at the end
    released = [a for m in moved for a in m.allocs]
    for a in released:
        what_if.release(a)
    try:
        placed = place_job(ctx.placer, lent_view(what_if, record, ctx.tide_states, ctx.running), record.spec,
                           state.nodes, exclude, feedback)
        if isinstance(placed, Unfit):
            return None
        for p in placed:
            what_if.allocate(p.alloc)
            taken.append(p.alloc)
        moves: list[Move] = []
        for m in sorted(moved, key=lambda m: (-m.gpus, m.job_id)):
            job = m.record
            avoid = state.lost | set(job.avoid_nodes)
            if ctx.earmark is not None and not may_use_earmarked(job, ctx.earmark, state.now, ctx.tree):
                avoid |= set(ctx.earmark.nodes)
            again = place_job(ctx.placer, lent_view(what_if, job, ctx.tide_states, ctx.running), job.spec,
                              state.nodes, avoid, weights_for(state.weights, job.spec))
            if isinstance(again, Unfit):
                return None
            for p in again:
                what_if.allocate(p.alloc)
                taken.append(p.alloc)
            moves.append(Move(job.job_id, m.gpus, m.work_lost_s, tuple(sorted({p.alloc.node_id for p in again}))))
        return moves
    finally:
        for a in reversed(taken):
            what_if.release(a)
        for a in reversed(released):
            what_if.allocate(a)


def _record_moves(ctx: CycleContext, record: JobRecord, moves: list[Move]) -> None:
    """Record the moves as preemptions by ``record`` and nominate it (see ``preempt.preempt_for``)."""
    for move in moves:
        job, _ = ctx.running.pop(move.job_id)  # its GPUs stay taken until its pods are gone
        why = f"consolidation: moved to make room for {record.job_id}; it fits again on {', '.join(move.lands_on)}"
        ctx.plan.preemptions.append(Preemption(move.job_id, record.job_id, why))
        ctx.usage.release(job.spec.metadata.queue, job_demand(job.spec))
    ctx.usage.admit(record.spec.metadata.queue, job_demand(record.spec))  # it holds its queue's share from now on
    gpus = sum(m.gpus for m in moves)
    ctx.plan.nominations[record.job_id] = (
        f"consolidating: moving {', '.join(m.job_id for m in moves)} ({gpus:g} GPU(s)) so it fits whole")
    ctx.changed()
