"""The admit action (pure): the order pending jobs are considered in, and the queue rules a job must
meet before it is placed (limits, lending limits, non-preemptible work within its guarantee)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tide.core.cycle_context import CycleContext
from tide.core.job_placement import job_demand
from tide.core.model import MILLI
from tide.core.preempt import job_preemptible
from tide.core.queues import EPS, Excess, PendingJob, limit_excess, order_pending, unlent_reserve
from tide.schemas.events import JobRecord
from tide.schemas.job import PRIORITY_VALUES


def admission_order(ctx: CycleContext, records: Mapping[str, JobRecord]) -> list[PendingJob]:
    """The pending jobs in the order the cycle considers them (``queues.order_pending``)."""
    return order_pending(ctx.tree, [
        PendingJob(r.job_id, r.spec.metadata.queue, PRIORITY_VALUES[r.spec.metadata.priority_class],
                   r.submitted_at, job_demand(r.spec), nominated=r.nominated_at is not None)
        for r in records.values()
    ], ctx.usage.by_path, ctx.capacity)


@dataclass(frozen=True)
class QuotaCheck:
    """``excess``: limits it would exceed (evicting work inside the limited queue can cure them);
    ``refused``: a rule no eviction cures (the job waits with this reason); both empty: admissible."""

    excess: list[Excess]
    refused: str = ""


def quota_check(ctx: CycleContext, record: JobRecord, demand: Mapping[str, float]) -> QuotaCheck:
    tree, queue = ctx.tree, record.spec.metadata.queue
    if not job_preemptible(tree, record.spec) and tree.has_guarantees:
        why = _beyond_guarantee(ctx, queue, demand)
        if why:
            return QuotaCheck([], f"not preemptible, so it may not borrow beyond its queue's guarantee: {why}")
    gpus = demand.get("gpu", 0.0)
    if gpus > 0:
        kept = unlent_reserve(tree, queue, ctx.usage.by_path)
        if kept > EPS:
            cluster = ctx.cluster
            free = float((cluster.milli_free * cluster.gpu_exists).sum()) / MILLI
            if free - gpus + EPS < kept:
                return QuotaCheck([], f"{kept:g} GPU(s) are kept unlent by other queues' lendingLimit "
                                      f"({free:g} free, {gpus:g} asked)")
    return QuotaCheck(limit_excess(tree, queue, demand, ctx.usage.by_path))


def _beyond_guarantee(ctx: CycleContext, queue: str, demand: Mapping[str, float]) -> str:
    """'' when admitting ``demand`` keeps every guaranteed level of the queue's path within its
    guarantee (and some level has one), else why not."""
    tree = ctx.tree
    guarded = False
    for path in tree.ancestors(tree.resolve(queue)):
        g = tree.guarantee(path)
        have = ctx.usage.get(path)
        for r, amount in g.items():
            need = demand.get(r, 0.0)
            if need <= 0:
                continue
            guarded = True
            if have.get(r, 0.0) + need > amount + EPS:
                return f"queue {path}: {r} {have.get(r, 0.0):g} in use + {need:g} > guarantee {amount:g}"
    return "" if guarded else f"queue {tree.resolve(queue) or queue} has no guarantee"
