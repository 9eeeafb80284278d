"""The tides action (pure): lent nodes as a borrower sees them, returns at the window's end, and the
lending pool's headroom (``keepGPUs``) refilled from the cheapest lent node. The rules themselves
(windows, parsing) are ``tide.core.tides``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tide.core.cluster import Cluster
from tide.core.cycle_context import CycleContext, Plan, Preemption, Running
from tide.core.job_placement import job_demand
from tide.core.model import MILLI, Allocation
from tide.core.tides import TideRule, TideState
from tide.schemas.events import JobRecord, JobState


def selector_pool(record: JobRecord) -> str | None:
    return record.spec.spec.template.node_selector.get("pool")


def borrows_from(record: JobRecord, allocs: Iterable[Allocation], rule: TideRule, cluster: Cluster) -> bool:
    """Does this job run on nodes that ``rule`` lends to its pool?"""
    if selector_pool(record) != rule.to:
        return False
    return any(cluster.labels[cluster.index[a.node_id]].get("pool") == rule.lend
               for a in allocs if a.node_id in cluster.index)


def return_lent_nodes(ctx: CycleContext) -> None:
    """Outside an open window, borrowed work on lent nodes is preempted (the nodes go back)."""
    for rule, tide in ctx.tide_states.items():
        if tide == TideState.OPEN:
            continue
        for job_id, (record, allocs) in list(ctx.running.items()):
            if record.state == JobState.RUNNING and borrows_from(record, allocs, rule, ctx.cluster):
                why = f"tidal window {tide}: {rule.lend} nodes go back"
                ctx.plan.preemptions.append(Preemption(job_id, "tide", why))
                ctx.running.pop(job_id)
                ctx.usage.release(record.spec.metadata.queue, job_demand(record.spec))


def lent_view(cluster: Cluster, record: JobRecord, tide_states: Mapping[TideRule, TideState],
              running: Running) -> Cluster:
    """The cluster as ``record`` may see it: in an open window, the lent nodes (``lending``) carry the
    borrowing pool's label, except for a job with ``preemptible: false`` (lent nodes go back when the
    window closes, which would evict it)."""
    if record.spec.spec.preemptible is False:
        return cluster
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
