"""The backfill action (pure): a blocked gang earmarks the nodes where it can start earliest, and only
jobs that cannot delay it may start there.

As Slurm's backfill reserves resources at a blocked job's earliest start time: each running job on a
node is expected to end at ``started_at + runtimeSeconds`` (a best-effort job that may be preempted at
once, since the gang may evict it; a stopping victim within its grace period; a job with no declared
runtime never). The earmark is the smallest set of nodes that holds the gang at the earliest time at
which any set does (one node when the gang requires a node or a finer level). A job behind the gang
may start on those nodes only if the gang may evict it at once (best-effort and preemptible) or its
declared runtime ends by that time; when that time is unknown (a job there declares no runtime), only
the former, since any runtime could then delay the gang.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tide.core.cluster import Cluster
from tide.core.cycle_context import Running
from tide.core.job_placement import pod_request, topology_levels
from tide.core.model import MILLI
from tide.core.preempt import job_preemptible
from tide.core.queues import QueueTree
from tide.core.topology import Level
from tide.schemas.events import JobRecord, JobState
from tide.schemas.job import PriorityClass


@dataclass(frozen=True)
class Earmark:
    gang: str
    nodes: list[str]
    start_at: float  # when the gang is expected to fit there (math.inf: a job on them declares no runtime)
    blocking: int  # jobs now on the earmarked nodes
    preemptible: int  # of them, preemptible

    def reason(self, now: float) -> str:
        when = "" if math.isinf(self.start_at) else f"; expected to start in {max(0.0, self.start_at - now):.0f} s"
        return (f"earmarked {len(self.nodes)} node(s) so it is not starved: it fits there once the {self.blocking} "
                f"job(s) on them end ({self.preemptible} of them preemptible){when}")


def gives_way(tree: QueueTree, record: JobRecord) -> bool:
    """May a blocked gang evict this job at once? Best-effort work that may be preempted at all."""
    return record.spec.metadata.priority_class == PriorityClass.BEST_EFFORT and job_preemptible(tree, record.spec)


def expected_end(record: JobRecord, now: float, tree: QueueTree) -> float:
    """When a job holding GPUs is expected to give them back."""
    if record.state == JobState.PREEMPTED:
        return now + record.spec.spec.grace_period_s
    if gives_way(tree, record):
        return now
    estimate = record.spec.spec.runtime_estimate_s
    if estimate is None:
        return math.inf
    started = record.started_at if record.started_at is not None else now
    return max(now, started + estimate)


def earmark_for(cluster: Cluster, record: JobRecord, running: Running, now: float, tree: QueueTree) -> Earmark:
    """The nodes to keep for the blocked gang ``record`` (see the module docstring)."""
    spec = record.spec
    request = pod_request(spec)
    per_pod = max(request.gpu_count * MILLI + request.gpu_milli, 1)
    gang = spec.spec.gang_size
    require, _ = topology_levels(spec)
    one_node = require is not None and require <= Level.NODE
    usable = cluster.gpu_exists.copy()
    if request.node_selector:
        labels = [all(lab.get(k) == v for k, v in request.node_selector) for lab in cluster.labels]
        usable &= np.array(labels)[:, None]
    free = np.where(usable, cluster.milli_free, 0).sum(axis=1).astype(float)
    capacity = np.where(usable, MILLI, 0).sum(axis=1).astype(float)
    events: list[tuple[float, int, float]] = []  # (time, node, milli it gives back)
    jobs_on: dict[int, list[JobRecord]] = {}
    for other, allocs in running.values():
        end = expected_end(other, now, tree)
        for a in allocs:
            i = cluster.index.get(a.node_id)
            if i is None or capacity[i] == 0:
                continue
            jobs_on.setdefault(i, []).append(other)
            events.append((end, i, float(sum(a.gpu_milli))))
    events.sort()
    freed = free.copy()
    start_at, counts = math.inf, np.zeros(len(free), dtype=np.int64)
    k = 0
    for t in [now, *sorted({e[0] for e in events if now < e[0] < math.inf}), math.inf]:
        while k < len(events) and events[k][0] <= t:
            freed[events[k][1]] += events[k][2]
            k += 1
        counts = (np.minimum(freed, capacity) // per_pod).astype(np.int64)
        if (counts.max(initial=0) if one_node else counts.sum()) >= gang:
            start_at = t
            break
    order = sorted(np.flatnonzero(capacity > 0), key=lambda i: (-counts[i], -free[i], cluster.node_ids[i]))
    chosen: list[int] = []
    held = 0
    for node in order:
        if one_node and counts[node] < gang:
            break
        chosen.append(int(node))
        held += int(counts[node])
        if one_node or held >= gang:
            break
    blocking = {r.job_id: r for i in chosen for r in jobs_on.get(i, [])}
    return Earmark(record.job_id, [cluster.node_ids[i] for i in chosen], start_at, len(blocking),
                   sum(gives_way(tree, r) for r in blocking.values()))


def may_use_earmarked(record: JobRecord, earmark: Earmark | None, now: float, tree: QueueTree) -> bool:
    """May this job start on the earmarked nodes? Only if the gang may evict it at once, or its declared
    runtime ends by the gang's expected start (a known one), so it cannot delay the gang."""
    if earmark is None or gives_way(tree, record):
        return True
    estimate = record.spec.spec.runtime_estimate_s
    return estimate is not None and not math.isinf(earmark.start_at) and now + estimate <= earmark.start_at
