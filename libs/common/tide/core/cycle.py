"""One scheduling cycle as a pure function: a snapshot in, a plan out.

The live placer and ``tide sim replay`` both call ``plan_cycle``; they differ only in how they
gather the snapshot and carry out the plan (Redis + node agents, or a virtual clock). The cycle runs
its actions, each a module of ``tide.core`` over one ``CycleContext``:

1. tides (``tidal``): outside an open window, borrowed work on lent nodes is preempted;
2. admit (``admit``): order the pending jobs (nominated, guarantees, queue priority, weighted DRF,
   priority, age); for each, the queue rules (limits, lending limits, non-preemptible work within
   its guarantee);
3. place: nodes it may not use (lost, failed before, earmarked for a gang unless it is preemptible or
   its declared runtime ends in time); place it whole on its view of the cluster (tides relabel lent
   nodes); the plan assumes each bind succeeds and places the next job on what is left;
4. preempt / reclaim (``preempt``): a job that does not fit, or is over a limit, may evict the
   cheapest whole set of eligible victims (priority, guarantee and fair-share reclaim, tides);
5. backfill (``backfill``): otherwise the first blocked gang earmarks the nodes where it can start
   earliest and the job stays pending with why;
6. tides: in an open window, a lending pool whose own jobs used up its headroom takes lent nodes back.

Queue usage counts running jobs and nominated preemptors, never stopping victims, in every check of
the cycle and across cycles, so two queues never reclaim from each other.
"""

from __future__ import annotations

from tide.core.admit import admission_order, quota_check
from tide.core.backfill import Earmark, earmark_for, may_use_earmarked
from tide.core.cycle_context import (
    Bind,
    CycleContext,
    CycleState,
    Plan,
    Preemption,
    QueueUsage,
    Running,
)
from tide.core.job_placement import job_demand, place_job, pod_request
from tide.core.model import Unfit
from tide.core.placer import Placer
from tide.core.preempt import FailedSearches, deterministic, may_preempt, preempt_for
from tide.core.tidal import Lending, lending, lent_view, refill_headroom, return_lent_nodes, selector_pool
from tide.core.tides import TideState
from tide.schemas.events import JobRecord
from tide.schemas.feedback import family_of

__all__ = ["Bind", "CycleState", "Earmark", "Lending", "Plan", "Preemption", "Running", "TideState", "lending",
           "plan_cycle", "selector_pool"]


def plan_cycle(state: CycleState, placer: Placer) -> Plan:
    cluster = state.cluster.copy()
    running: Running = dict(state.running)
    ctx = CycleContext(
        state=state, placer=placer, plan=Plan(), cluster=cluster, running=running,
        usage=QueueUsage.of(state.tree, running, state.pending),
        capacity={"gpu": float(cluster.gpu_exists.sum()), "cpu": float(cluster.cpu_cap.sum()),
                  "memory": float(cluster.mem_cap.sum())},
        tide_states={rule: rule.state(state.wall) for rule in state.tides} if state.wall else {},
        failed=FailedSearches() if deterministic(placer) else None,
    )
    return_lent_nodes(ctx)
    if state.pending and state.nodes:
        _admit_and_place(ctx)
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
        if ctx.earmark is not None and not may_use_earmarked(record, ctx.earmark, state.now):
            exclude |= set(ctx.earmark.nodes)
        feedback = state.weights.get(family_of(record.spec))
        result: list | Unfit
        if check.excess:
            result = Unfit(check.excess[0].reason, True)
        else:
            view = lent_view(ctx.cluster, record, ctx.tide_states, ctx.running)
            result = place_job(ctx.placer, view, record.spec, state.nodes, exclude, feedback)
        if isinstance(result, Unfit):
            if result.resolvable and may_preempt(ctx, record, lowest, check.excess) and preempt_for(
                    ctx, record, exclude, feedback, check.excess):
                if nominated and record.job_id not in ctx.plan.nominations:
                    ctx.usage.admit(record.spec.metadata.queue, demand)  # still waiting for its victims
                continue
            reason = result.reason
            if result.resolvable and ctx.earmark is None and record.spec.spec.gang_size > 1 and not check.excess:
                ctx.earmark = earmark_for(ctx.cluster, record, ctx.running, state.now)
                reason += "; " + ctx.earmark.reason(state.now)
            _not_placed(ctx, record, Unfit(reason, result.resolvable), nominated, demand)
            continue
        ctx.plan.binds.append(Bind(record, result, feedback))
        ctx.changed()
        for p in result:
            ctx.placer.observe(pod_request(record.spec))
            ctx.cluster.allocate(p.alloc)
        ctx.running[record.job_id] = (record, [p.alloc for p in result])
        ctx.usage.admit(record.spec.metadata.queue, demand)


def _not_placed(ctx: CycleContext, record: JobRecord, unfit: Unfit, nominated: bool, demand: dict[str, float]) -> None:
    ctx.plan.not_placed.append((record, unfit))
    if nominated:
        ctx.usage.admit(record.spec.metadata.queue, demand)  # its nomination still holds its share

