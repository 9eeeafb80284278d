"""The one typed context a scheduling cycle's actions share (pure, no I/O).

``CycleState`` is the snapshot the placer or the replay gathers; ``Plan`` is what the cycle decides;
``CycleContext`` is the working state in between: the cluster with every planned bind applied, the
jobs still holding claims (minus the ones the plan preempts) and the queues' usage, which counts
running jobs and the demand of nominated preemptors, never the victims that are stopping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tide.core.cluster import Cluster
from tide.core.job_placement import PodPlacement, job_demand
from tide.core.model import Allocation, Unfit
from tide.core.placer import Placer
from tide.core.queues import QueueTree, Resources, add
from tide.core.tides import TideRule, TideState
from tide.schemas.events import JobRecord, JobState
from tide.schemas.feedback import FamilyWeights
from tide.schemas.job import PRIORITY_VALUES, JobSpec
from tide.schemas.node import NodeDescription

if TYPE_CHECKING:  # pragma: no cover
    from tide.core.backfill import Earmark
    from tide.core.preempt import FailedSearches

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
    min_runtime_s: float = 60.0  # the default minimum runtime (the queue config may set its own)
    preemption_timeout_s: float = 120.0
    extra_allocs: dict[str, dict[int, Allocation]] = field(default_factory=dict)
    """job -> pod index -> allocation of each elastic extra pod (index >= minMember) holding claims"""


@dataclass(frozen=True)
class Bind:
    record: JobRecord
    placements: list[PodPlacement]
    feedback: FamilyWeights | None = None


@dataclass(frozen=True)
class Preemption:
    """Stop a running job whole, or with ``pods`` only those elastic extra pods (the job keeps running)."""

    job_id: str
    by: str
    why: str
    pods: tuple[int, ...] = ()


@dataclass(frozen=True)
class TimedOut:
    """A pending gang past its ``gangTimeoutSeconds``: ``fail`` (the job fails with ``reason``) or
    ``shrink`` (its spec becomes ``spec``: minMember 1, the other pods elastic extras)."""

    record: JobRecord
    action: str
    reason: str
    spec: JobSpec | None = None


@dataclass
class Plan:
    binds: list[Bind] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    nominations: dict[str, str] = field(default_factory=dict)  # preemptor -> reason
    not_placed: list[tuple[JobRecord, Unfit]] = field(default_factory=list)
    grows: list[Bind] = field(default_factory=list)  # extra pods for running elastic jobs
    timed_out: list[TimedOut] = field(default_factory=list)


def counts_for_its_queue(record: JobRecord) -> bool:
    """Does a job holding claims count in its queue's usage? Not while it is stopping (preempted)."""
    return record.state != JobState.PREEMPTED


@dataclass
class QueueUsage:
    """Usage per queue path (every job counted in its queue and all its ancestors)."""

    tree: QueueTree
    by_path: dict[str, Resources] = field(default_factory=dict)

    @classmethod
    def of(cls, tree: QueueTree, running: Running, pending: Iterable[JobRecord]) -> QueueUsage:
        """Running jobs that are not stopping, and the demand of nominated preemptors not yet placed."""
        usage = cls(tree)
        paths: dict[str, list[str]] = {}  # a queue name -> the paths its jobs count in
        for record, _ in running.values():
            if counts_for_its_queue(record):
                usage._add(usage._paths(record.spec.metadata.queue, paths), job_demand(record.spec))
        for record in pending:
            if record.nominated_at is not None and record.job_id not in running:
                usage._add(usage._paths(record.spec.metadata.queue, paths), job_demand(record.spec))
        return usage

    def _paths(self, queue: str, known: dict[str, list[str]]) -> list[str]:
        if queue not in known:
            known[queue] = self.tree.ancestors(self.tree.resolve(queue))
        return known[queue]

    def _add(self, paths: list[str], demand: Mapping[str, float]) -> None:
        """``admit`` in place (the same sums in the same order, without a new dict per path)."""
        for path in paths:
            held = self.by_path.setdefault(path, {})
            for k, v in demand.items():
                held[k] = held.get(k, 0.0) + v

    def admit(self, queue: str, demand: Mapping[str, float]) -> None:
        for path in self.tree.ancestors(self.tree.resolve(queue)):
            self.by_path[path] = add(self.by_path.get(path, {}), demand)

    def release(self, queue: str, demand: Mapping[str, float]) -> None:
        for path in self.tree.ancestors(self.tree.resolve(queue)):
            self.by_path[path] = add(self.by_path.get(path, {}), demand, -1.0)

    def get(self, path: str) -> Resources:
        return self.by_path.get(path, {})


@dataclass
class CycleContext:
    """The working state the actions of one cycle read and change (see the module docstring)."""

    state: CycleState
    placer: Placer
    plan: Plan
    cluster: Cluster
    running: Running
    usage: QueueUsage
    capacity: Resources
    tide_states: dict[TideRule, TideState]
    failed: FailedSearches | None = None
    earmark: Earmark | None = None
    waiting: bool = False  # a pending job waits for room (or for its victims): no elastic extras this cycle
    moves_left: int = 4  # consolidation: jobs that may still be moved this cycle (tide.core.consolidate)
    searches_left: int = 8  # consolidation: pending jobs that may still be searched for this cycle
    # consolidation searches that found nothing since a change
    consolidation_failed: set[tuple[Any, ...]] = field(default_factory=set)

    @property
    def tree(self) -> QueueTree:
        return self.state.tree

    def lowest_running_priority(self) -> int | None:
        return min((PRIORITY_VALUES[r.spec.metadata.priority_class] for r, _ in self.running.values()
                    if r.state == JobState.RUNNING), default=None)

    def changed(self) -> None:
        """A bind or a planned preemption: what the failed victim searches saw no longer holds."""
        if self.failed is not None:
            self.failed.changed()
        self.consolidation_failed.clear()
