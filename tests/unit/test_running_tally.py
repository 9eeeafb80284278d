"""The running tally (``tide.core.running_tally``): kept across changes it answers what a count from scratch
answers, exactly, and its queue usage is the exact sum of the demands (issue 17: the placer counted every running
job in every cycle)."""

from __future__ import annotations

import random
from fractions import Fraction

from tide.core.cycle_context import QueueUsage, Running
from tide.core.job_placement import job_demand
from tide.core.queues import QueueTree
from tide.core.running_tally import RunningTally
from tide.schemas.events import JobRecord, JobState, PodRecord
from tide.schemas.job import PRIORITY_VALUES, JobSpec

TREE = QueueTree.from_config({"queues": [{"name": "a", "children": [{"name": "x"}, {"name": "y"}]},
                                         {"name": "b"}]})
QUEUES = ["a/x", "a/y", "a/x/undeclared", "b", "a", "default"]
PRIORITIES = list(PRIORITY_VALUES)


def record(job_id: str, rng: random.Random) -> JobRecord:
    resources: dict = {"cpuMilli": rng.choice([0, 500, 3000]), "memoryMiB": rng.choice([0, 1024, 7000])}
    kind = rng.choice(["whole", "share", "mig", "none"])
    if kind == "whole":
        resources["gpu"] = rng.randint(1, 8)
    elif kind == "share":
        resources["gpuShare"] = {"memoryMiB": 10_000, "smPercent": rng.choice([10, 20, 30, 33])}
    elif kind == "mig":
        resources["mig"] = rng.choice(["1g.10gb", "2g.20gb", "3g.40gb"])
    replicas = rng.randint(1, 3)
    body: dict = {"replicas": replicas, "template": {"command": ["x"], "resources": resources}}
    if replicas > 1 and rng.random() < 0.3:
        body["minMember"] = 1  # elastic
    spec = JobSpec.model_validate({"metadata": {"name": job_id, "queue": rng.choice(QUEUES),
                                                "priorityClass": rng.choice(PRIORITIES)}, "spec": body})
    state = rng.choice([JobState.RUNNING, JobState.RUNNING, JobState.PENDING, JobState.PREEMPTED])
    return JobRecord(job_id=job_id, spec=spec, state=state, submitted_at=0.0, updated_at=0.0,
                     pods=[PodRecord(name=f"{job_id}-{i}", index=i) for i in range(replicas)])


def exact_usage(running: Running) -> dict[str, dict[str, float]]:
    """The usage by path summed as fractions (no rounding until the end)."""
    sums: dict[str, dict[str, Fraction]] = {}
    for r, _ in running.values():
        if r.state == JobState.PREEMPTED:
            continue
        for path in TREE.ancestors(TREE.resolve(r.spec.metadata.queue)):
            held = sums.setdefault(path, {})
            for k, v in job_demand(r.spec).items():
                held[k] = held.get(k, Fraction(0)) + Fraction(v).limit_denominator(7000)
    return {p: {k: float(v) for k, v in held.items()} for p, held in sums.items()}


def test_a_tally_kept_across_changes_answers_as_one_counted_from_scratch() -> None:
    rng = random.Random(11)
    kept = RunningTally()
    running: Running = {}
    for step in range(300):
        running = dict(running)  # the view hands each cycle a map of its own
        for _ in range(rng.randint(1, 6)):
            action = rng.random()
            if action < 0.45 or not running:
                r = record(f"j{step}-{rng.randint(0, 10**6)}", rng)
                running[r.job_id] = (r, [])
            elif action < 0.75:
                del running[rng.choice(list(running))]
            else:  # the record changed (a new object): another state, priority, queue or size
                job_id = rng.choice(list(running))
                running[job_id] = (record(job_id, rng), [])
        if step % 2:
            kept.sync(running)
        else:  # told which jobs changed, as the placer's view tells it
            previous = kept.synced_to or {}
            changed = {j for j in running.keys() | previous.keys()
                       if j not in running or j not in previous or running[j][0] is not previous[j][0]}
            kept.sync(running, changed)
        fresh = RunningTally.of(running)
        assert kept.usage(TREE) == fresh.usage(TREE) == exact_usage(running), f"step {step}"
        assert kept.elastic == fresh.elastic == {j for j, (r, _) in running.items() if r.spec.spec.elastic}
        lowest = min((PRIORITY_VALUES[r.spec.metadata.priority_class] for r, _ in running.values()
                      if r.state == JobState.RUNNING), default=None)
        assert kept.lowest_running_priority(running) == lowest
        # the cycle's own map loses the jobs it plans to stop: the lowest priority is that of the rest
        some = dict(list(running.items())[: len(running) // 2])
        assert kept.lowest_running_priority(some) == min(
            (PRIORITY_VALUES[r.spec.metadata.priority_class] for r, _ in some.values()
             if r.state == JobState.RUNNING), default=None)


def test_queue_usage_is_the_exact_sum_whatever_the_order() -> None:
    """100m + 200m of a GPU is 0.3 GPU, not 0.30000000000000004 (a queue limited to 0.3 GPU holds both)."""
    def share(job_id: str, percent: int) -> JobRecord:
        spec = JobSpec.model_validate({"metadata": {"name": job_id, "queue": "b"}, "spec": {"template": {
            "command": ["x"], "resources": {"gpuShare": {"memoryMiB": 1000, "smPercent": percent}}}}})
        return JobRecord(job_id=job_id, spec=spec, state=JobState.RUNNING, submitted_at=0.0, updated_at=0.0,
                         pods=[PodRecord(name=f"{job_id}-0", index=0)])

    running: Running = {"s1": (share("s1", 10), []), "s2": (share("s2", 20), [])}
    assert QueueUsage.of(TREE, running, []).get("b")["gpu"] == 0.3
    backwards: Running = dict(reversed(running.items()))
    assert QueueUsage.of(TREE, backwards, []).by_path == QueueUsage.of(TREE, running, []).by_path


def test_queue_usage_counts_afresh_when_the_tally_counts_another_map() -> None:
    rng = random.Random(5)
    running: Running = {f"r{i}": (record(f"r{i}", rng), []) for i in range(20)}
    stale = RunningTally.of({})
    assert QueueUsage.of(TREE, running, [], stale).by_path == exact_usage(running)
