"""What every cycle would otherwise count over every job holding claims, kept as those jobs come, change and go.

A cluster at a steady load runs hundreds of jobs and the placer plans tens of cycles a second, each of which
sees only a few of them change. The tally remembers, per job, the record it counted; bringing it up to date
(``sync``) looks at each job once (is its record the same object?) and counts again only the changed ones:

- the demand of the jobs that count in their queue's usage, summed per queue name as whole numbers
  (``demand_units``: GPUs in 1/``GPU_UNITS``), so that a sum kept across cycles is exactly the sum counted
  from scratch, in any order;
- the jobs in state RUNNING, per priority value (the lowest running priority);
- the elastic jobs (only they have extra pods to place, hold or stop).

``QueueUsage.of`` and the cycle read it; the replay builds one from scratch each cycle (``RunningTally.of``),
the live placer keeps one across cycles: both plan with the same numbers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from tide.core.job_placement import GPU_UNITS, demand_units
from tide.core.queues import QueueTree, Resources
from tide.schemas.events import JobRecord, JobState
from tide.schemas.job import PRIORITY_VALUES

if TYPE_CHECKING:  # pragma: no cover
    from tide.core.cycle_context import Running

Sums = list[int]  # [jobs, GPU units, mCPU, MiB]


def counts_for_its_queue(record: JobRecord) -> bool:
    """Does a job holding claims count in its queue's usage? Not while it is stopping (preempted)."""
    return record.state != JobState.PREEMPTED


class RunningTally:
    def __init__(self) -> None:
        self._counted: dict[str, JobRecord] = {}  # job -> the record counted
        self._by_queue: dict[str, Sums] = {}  # queue name (as the spec gives it) -> sums of its counted jobs
        self._running_by_priority: dict[int, set[str]] = {}  # priority value -> jobs in state RUNNING
        self.elastic: set[str] = set()
        self.synced_to: Running | None = None  # the map of jobs last synced to (the cycle checks it is its own)

    @classmethod
    def of(cls, running: Running) -> RunningTally:
        tally = cls()
        tally.sync(running)
        return tally

    @classmethod
    def counting(cls, running: Running, kept: RunningTally | None) -> RunningTally:
        """``kept`` when it was last synced to ``running`` (this very map), else one counted now."""
        return kept if kept is not None and kept.synced_to is running else cls.of(running)

    def sync(self, running: Running, changed: Iterable[str] | None = None) -> None:
        """Count the jobs of ``running`` (job -> (record, allocations)) and only them; ``changed``: the only jobs
        that may have come, gone or changed record since the last sync (None: look at every one)."""
        counted = self._counted
        if changed is None:
            for job_id in [j for j in counted if j not in running]:
                self._remove(job_id, counted.pop(job_id))
            changed = running
        for job_id in changed:
            held = running.get(job_id)
            record = held[0] if held is not None else None
            before = counted.get(job_id)
            if before is record:
                continue
            if before is not None:
                self._remove(job_id, before)
                del counted[job_id]
            if record is not None:
                counted[job_id] = record
                self._add(job_id, record)
        self.synced_to = running

    def _add(self, job_id: str, record: JobRecord) -> None:
        if counts_for_its_queue(record):
            _add_units(self._by_queue.setdefault(record.spec.metadata.queue, [0, 0, 0, 0]), record, 1)
        if record.state == JobState.RUNNING:
            self._running_by_priority.setdefault(PRIORITY_VALUES[record.spec.metadata.priority_class],
                                                 set()).add(job_id)
        if record.spec.spec.elastic:
            self.elastic.add(job_id)

    def _remove(self, job_id: str, record: JobRecord) -> None:
        if counts_for_its_queue(record):
            queue = record.spec.metadata.queue
            sums = self._by_queue[queue]
            _add_units(sums, record, -1)
            if not sums[0]:
                del self._by_queue[queue]
        if record.state == JobState.RUNNING:
            priority = PRIORITY_VALUES[record.spec.metadata.priority_class]
            jobs = self._running_by_priority[priority]
            jobs.discard(job_id)
            if not jobs:
                del self._running_by_priority[priority]
        self.elastic.discard(job_id)

    def usage(self, tree: QueueTree, nominated: Collection[JobRecord] = ()) -> dict[str, Resources]:
        """Usage per queue path (each queue's sums in it and all its ancestors) of the counted jobs and of
        ``nominated`` (preemptors not yet placed, counted from their nomination)."""
        by_queue = self._by_queue
        if nominated:
            by_queue = {q: list(s) for q, s in by_queue.items()}
            for record in nominated:
                _add_units(by_queue.setdefault(record.spec.metadata.queue, [0, 0, 0, 0]), record, 1)
        by_path: dict[str, Sums] = {}
        for queue, sums in by_queue.items():
            for path in tree.ancestors(tree.resolve(queue)):
                held = by_path.setdefault(path, [0, 0, 0, 0])
                for i in range(4):
                    held[i] += sums[i]
        return {path: {"gpu": s[1] / GPU_UNITS, "cpu": float(s[2]), "memory": float(s[3])}
                for path, s in by_path.items()}

    def lowest_running_priority(self, running: Running) -> int | None:
        """The lowest priority of the counted RUNNING jobs still in ``running`` (the cycle's map, which has lost
        the jobs it plans to stop)."""
        for priority in sorted(self._running_by_priority):
            if any(job_id in running for job_id in self._running_by_priority[priority]):
                return priority
        return None


def _add_units(sums: Sums, record: JobRecord, sign: int) -> None:
    gpu, cpu, memory = demand_units(record.spec)
    sums[0] += sign
    sums[1] += sign * gpu
    sums[2] += sign * cpu
    sums[3] += sign * memory
