"""One scheduling cycle as a pure function: a snapshot in, a plan out.

The live placer and ``tide sim replay`` both call ``plan_cycle``; they differ only in how they
gather the snapshot and carry out the plan (Redis + node agents, or a virtual clock). The cycle runs
its actions, each a module of ``tide.core`` over one ``CycleContext``:

1. tides (``tidal``): outside an open window, borrowed work on lent nodes is preempted;
2. admit (``admit``): order the pending jobs (nominated, guarantees, queue priority, weighted DRF,
   priority, age); for each, the queue rules (limits, lending limits, non-preemptible work within
   its guarantee);
3. place: nodes it may not use (lost, earmarked for a gang unless it is preemptible or its declared
   runtime ends in time) and nodes that failed to start it before (used only when nothing else fits,
   never preempted on); place it whole on its view of the cluster (tides relabel lent nodes); the plan
   assumes each bind succeeds and places the next job on what is left;
4. consolidate (``consolidate``): a job that does not fit only because the free GPUs are scattered
   moves a few checkpointable jobs of its priority or lower, each of which fits again elsewhere;
   preempt / reclaim (``preempt``): otherwise a job that does not fit, or is over a limit, may evict
   the cheapest whole set of eligible victims (priority, guarantee and fair-share reclaim, tides);
5. backfill (``backfill``): otherwise the first blocked gang earmarks the nodes where it can start
   earliest and the job stays pending with why; a gang past its ``gangTimeoutSeconds`` instead fails
   or shrinks to minMember 1 (``onTimeout``) and earmarks nothing;
6. elastic extras: when no pending job waits for room, the pods of elastic jobs beyond minMember
   (the jobs bound this cycle, then the running ones) take what is left, within their queues' limits;
7. tides: in an open window, a lending pool whose own jobs used up its headroom takes lent nodes back.

Queue usage counts running jobs and nominated preemptors, never stopping victims, in every check of
the cycle and across cycles, so two queues never reclaim from each other.
"""

from __future__ import annotations

from tide.core.admit import admission_order, quota_check
from tide.core.backfill import Earmark, earmark_for, may_use_earmarked
from tide.core.cluster import Cluster
from tide.core.consolidate import consolidate_for
from tide.core.cycle_context import (
    Bind,
    CycleContext,
    CycleState,
    Plan,
    Preemption,
    QueueUsage,
    Running,
    TimedOut,
)
from tide.core.job_placement import (
    PodPlacement,
    cordoned,
    gang_capacity,
    job_demand,
    missing_extras,
    place_extras,
    place_job,
    pod_request,
)
from tide.core.model import Unfit
from tide.core.placer import Placer
from tide.core.preempt import FailedSearches, deterministic, may_preempt, preempt_for
from tide.core.queues import limit_excess
from tide.core.running_tally import RunningTally
from tide.core.tidal import Lending, lending, lent_view, refill_headroom, return_lent_nodes, selector_pool
from tide.core.tides import TideState
from tide.schemas.events import POD_DONE_STATES, JobRecord, JobState
from tide.schemas.feedback import FamilyWeights, weights_for
from tide.schemas.job import PRIORITY_VALUES, JobSpec

__all__ = ["Bind", "CycleState", "Earmark", "Lending", "Plan", "Preemption", "Running", "TideState", "lending",
           "TimedOut", "gang_timed_out", "plan_cycle", "selector_pool"]


def plan_cycle(state: CycleState, placer: Placer) -> Plan:
    cluster = state.cluster.copy()
    running: Running = dict(state.running)
    tally = RunningTally.counting(state.running, state.tally)
    ctx = CycleContext(
        state=state, placer=placer, plan=Plan(), cluster=cluster, running=running, tally=tally,
        usage=QueueUsage.of(state.tree, state.running, state.pending, tally),
        capacity={"gpu": float(cluster.gpu_exists.sum()), "cpu": float(cluster.cpu_cap.sum()),
                  "memory": float(cluster.mem_cap.sum())},
        tide_states={rule: rule.state(state.wall) for rule in state.tides} if state.wall else {},
        failed=FailedSearches() if deterministic(placer) else None,
    )
    return_lent_nodes(ctx)
    if state.pending and state.nodes:
        _admit_and_place(ctx)
    if state.nodes and not ctx.waiting:
        _place_extras(ctx)
    refill_headroom(ctx.plan, ctx.cluster, ctx.running, ctx.tide_states)
    return ctx.plan


def _admit_and_place(ctx: CycleContext) -> None:
    """Steps 2-5: place the pending jobs in order, planning preemptions where allowed."""
    state = ctx.state
    records = {r.job_id: r for r in state.pending if r.not_before <= state.now}
    lowest = ctx.lowest_running_priority()
    for pending in admission_order(ctx, records):
        record = records[pending.job_id]
        demand = job_demand(record.spec)
        nominated = record.nominated_at is not None and record.job_id not in ctx.running
        if nominated:
            ctx.usage.release(record.spec.metadata.queue, demand)  # counted from the start: now it is decided
        check = quota_check(ctx, record, demand)
        if check.refused:
            _not_placed(ctx, record, Unfit(check.refused, True), nominated, demand)
            continue
        exclude = state.lost | set(record.avoid_nodes)
        if ctx.earmark is not None and not may_use_earmarked(record, ctx.earmark, state.now, ctx.tree):
            exclude |= set(ctx.earmark.nodes)
        feedback = weights_for(state.weights, record.spec)
        result: list[PodPlacement] | Unfit
        if check.excess:
            result = Unfit(check.excess[0].reason, True)
        else:
            view = lent_view(ctx.cluster, record, ctx.tide_states, ctx.running)
            result = place_job(ctx.placer, view, record.spec, state.nodes, exclude, feedback)
            if isinstance(result, Unfit) and record.avoid_nodes:
                # a node that failed to start the job is a last resort, not a ban: where nothing else fits
                # now, the job tries it again (after its requeue backoff) rather than wait forever (every
                # node of a small cluster may have failed once, e.g. while its agent restarted); it never
                # preempts for one, below
                result = _placed_on_avoided(ctx, record, view, exclude, feedback, result)
        if isinstance(result, Unfit):
            if result.resolvable and not check.excess and consolidate_for(ctx, record, exclude, feedback):
                ctx.waiting = True  # its moved jobs stop; it is nominated like a preemptor
                continue
            if result.resolvable and may_preempt(ctx, record, lowest, check.excess) and preempt_for(
                    ctx, record, exclude, feedback, check.excess):
                ctx.waiting = True
                if nominated and record.job_id not in ctx.plan.nominations:
                    ctx.usage.admit(record.spec.metadata.queue, demand)  # still waiting for its victims
                continue
            if gang_timed_out(record, state.now):
                record = _time_out(ctx, record, exclude, feedback)
                if record.spec.spec.gang_size > 1:  # failed: it earmarks nothing
                    continue
                if not _bound(ctx, record, exclude, feedback):  # shrunk, and not even one pod fits now
                    ctx.waiting = True
                    _not_placed(ctx, record, Unfit(ctx.plan.timed_out[-1].reason), nominated, demand)
                continue
            if result.resolvable and not check.excess:
                ctx.waiting = True
            reason = result.reason
            if result.resolvable and ctx.earmark is None and record.spec.spec.gang_size > 1 and not check.excess:
                ctx.earmark = earmark_for(ctx.cluster, record, ctx.running, state.now, ctx.tree)
                reason += "; " + ctx.earmark.reason(state.now)
            _not_placed(ctx, record, Unfit(reason, result.resolvable), nominated, demand)
            continue
        _bind(ctx, record, result, feedback)


def _placed_on_avoided(ctx: CycleContext, record: JobRecord, view: Cluster, exclude: set[str],
                       feedback: FamilyWeights | None, unfit: Unfit) -> list[PodPlacement] | Unfit:
    """The job placed on ``view`` (its view of the cluster) allowing the nodes it avoids (still not lost or
    earmarked ones), else ``unfit``."""
    avoided = set(record.avoid_nodes) - ctx.state.lost
    if ctx.earmark is not None and not may_use_earmarked(record, ctx.earmark, ctx.state.now, ctx.tree):
        avoided -= set(ctx.earmark.nodes)
    if not avoided:
        return unfit
    again = place_job(ctx.placer, view, record.spec, ctx.state.nodes, exclude - avoided, feedback)
    return unfit if isinstance(again, Unfit) else again


def _bind(
    ctx: CycleContext, record: JobRecord, placements: list[PodPlacement], feedback: FamilyWeights | None
) -> None:
    ctx.plan.binds.append(Bind(record, placements, feedback))
    ctx.changed()
    for p in placements:
        ctx.placer.observe(pod_request(record.spec))
        ctx.cluster.allocate(p.alloc)
    ctx.running[record.job_id] = (record, [p.alloc for p in placements])
    ctx.usage.admit(record.spec.metadata.queue, job_demand(record.spec))


def gang_timed_out(record: JobRecord, now: float) -> bool:
    """Has a pending gang waited past its ``gangTimeoutSeconds`` since it was (last) queued? (Not while
    its victims stop: a nominated gang is about to start.)"""
    body = record.spec.spec
    queued = record.queued_at if record.queued_at is not None else record.submitted_at
    return (body.gang_timeout_s is not None and body.gang_size > 1 and record.nominated_at is None
            and now - queued > body.gang_timeout_s)


def _time_out(ctx: CycleContext, record: JobRecord, exclude: set[str], feedback: FamilyWeights | None) -> JobRecord:
    """Record the timeout in the plan (the gang earmarks nothing); ``shrink`` returns the record with
    minMember 1 (its other pods become elastic extras), ``fail`` the record as it is."""
    body = record.spec.spec
    view = lent_view(ctx.cluster, record, ctx.tide_states, ctx.running)
    request = pod_request(record.spec, feedback)
    fit = gang_capacity(ctx.placer, cordoned(view, exclude).copy(), request, body.gang_size)
    reason = (f"gang timeout: {body.gang_size - fit} of {body.gang_size} pods could not be placed "
              f"within {body.gang_timeout_s}s")
    if body.on_timeout != "shrink":
        ctx.plan.timed_out.append(TimedOut(record, "fail", reason))
        return record
    shrunk = shrunk_spec(record.spec)
    ctx.plan.timed_out.append(TimedOut(record, "shrink", f"{reason}; shrunk to minMember 1", shrunk))
    return record.model_copy(update={"spec": shrunk})


def shrunk_spec(spec: JobSpec) -> JobSpec:
    """The spec of a gang that timed out with ``onTimeout: shrink``: minMember 1, no longer a strict gang."""
    return spec.model_copy(update={"spec": spec.spec.model_copy(update={"min_member": 1, "gang_timeout_s": None})})


def _bound(ctx: CycleContext, record: JobRecord, exclude: set[str], feedback: FamilyWeights | None) -> bool:
    """Place a shrunk gang's first pod now, if it fits (its other pods follow as extras)."""
    view = lent_view(ctx.cluster, record, ctx.tide_states, ctx.running)
    result = place_job(ctx.placer, view, record.spec, ctx.state.nodes, exclude, feedback)
    if isinstance(result, Unfit):
        return False
    _bind(ctx, record, result, feedback)
    return True


def _place_extras(ctx: CycleContext) -> None:
    """Step 6: the elastic extras of the jobs bound this cycle (in the same reservation), then the missing
    extras of running elastic jobs (highest priority, then longest running, first), on what is left."""
    state = ctx.state
    for bind in ctx.plan.binds:
        if bind.record.spec.spec.elastic:
            bind.placements.extend(_extras_for(ctx, bind.record, bind.feedback))
    bound = {b.record.job_id for b in ctx.plan.binds}
    # the elastic jobs of ``running`` as the cycle began (the tally's) that it still holds: only binds add
    # jobs to it, and those are ``bound``
    elastic = [ctx.running[j][0] for j in ctx.tally.elastic if j in ctx.running]
    growing = [r for r in elastic if r.job_id not in bound and r.state == JobState.RUNNING
               and not r.cancel_requested and not _gang_done(r)]
    growing.sort(key=lambda r: (-PRIORITY_VALUES[r.spec.metadata.priority_class], r.started_at or 0.0, r.job_id))
    for record in growing:
        placements = _extras_for(ctx, record, weights_for(state.weights, record.spec))
        if placements:
            ctx.plan.grows.append(Bind(record, placements))


def _gang_done(record: JobRecord) -> bool:
    """Has a pod of the job's gang ended? Then it is winding down: no new extras."""
    return any(p.state in POD_DONE_STATES for p in record.pods if p.index < record.spec.spec.gang_size)


def _extras_for(ctx: CycleContext, record: JobRecord, feedback: FamilyWeights | None) -> list[PodPlacement]:
    """Place the job's missing extras on ``ctx.cluster`` (allocated there), within its queues' limits."""
    state = ctx.state
    indices = missing_extras(record)
    if not indices:
        return []
    body = record.spec.spec
    per_pod = {k: v / body.gang_size for k, v in job_demand(record.spec).items()}
    room = 0
    usage = ctx.usage.by_path
    while room < len(indices) and not limit_excess(
            ctx.tree, record.spec.metadata.queue, {k: v * (room + 1) for k, v in per_pod.items()}, usage):
        room += 1
    exclude = state.lost | set(record.avoid_nodes)
    if ctx.earmark is not None and not may_use_earmarked(record, ctx.earmark, state.now, ctx.tree):
        exclude |= set(ctx.earmark.nodes)
    view = lent_view(ctx.cluster, record, ctx.tide_states, ctx.running)
    placements = place_extras(ctx.placer, view, record.spec, indices[:room], exclude, feedback)
    if not placements:
        return []
    ctx.changed()
    held = ctx.running.get(record.job_id, (record, []))[1]
    for p in placements:
        ctx.cluster.allocate(p.alloc)
    ctx.running[record.job_id] = (record, [*held, *(p.alloc for p in placements)])
    return placements


def _not_placed(ctx: CycleContext, record: JobRecord, unfit: Unfit, nominated: bool, demand: dict[str, float]) -> None:
    ctx.plan.not_placed.append((record, unfit))
    if nominated:
        ctx.usage.admit(record.spec.metadata.queue, demand)  # its nomination still holds its share

