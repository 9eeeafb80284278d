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
from tide.core.job_placement import PodPlacement
from tide.core.model import Allocation, Unfit
from tide.core.placer import Placer
from tide.core.queues import QueueTree, Resources, add
from tide.core.running_tally import RunningTally
from tide.core.tides import TideRule, TideState
from tide.schemas.events import JobRecord
from tide.schemas.feedback import FamilyWeights
from tide.schemas.job import JobSpec
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
    tally: RunningTally | None = None
    """``running`` counted (the live placer keeps one across cycles); None, or one synced to another map: the
    cycle counts ``running`` itself"""


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


@dataclass
class QueueUsage:
    """Usage per queue path (every job counted in its queue and all its ancestors)."""

    tree: QueueTree
    by_path: dict[str, Resources] = field(default_factory=dict)

    @classmethod
    def of(cls, tree: QueueTree, running: Running, pending: Iterable[JobRecord],
           tally: RunningTally | None = None) -> QueueUsage:
        """Running jobs that are not stopping, and the demand of nominated preemptors not yet placed, summed
        exactly (``RunningTally``: ``tally`` when it counts ``running``, else one counted now)."""
        nominated = [r for r in pending if r.nominated_at is not None and r.job_id not in running]
        return cls(tree, RunningTally.counting(running, tally).usage(tree, nominated))

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
    tally: RunningTally  # ``state.running`` counted
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
        """The lowest priority of a job in state RUNNING still in ``running``."""
        return self.tally.lowest_running_priority(self.running)

    def changed(self) -> None:
        """A bind or a planned preemption: what the failed victim searches saw no longer holds."""
        if self.failed is not None:
            self.failed.changed()
        self.consolidation_failed.clear()
