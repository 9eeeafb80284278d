"""The pure scheduling cycle: backfill by declared runtime, preemption plans, tidal returns."""

from __future__ import annotations

from datetime import datetime

from tide.core import Cluster, Placer
from tide.core.cycle import CycleState, plan_cycle
from tide.core.model import MILLI, Allocation
from tide.core.tides import parse_tides
from tide.schemas.events import JobRecord, JobState, PodRecord
from tide.schemas.job import JobSpec

from tests.helpers import small_node


def record(job_id: str, gpu: int, replicas: int = 1, runtime: float | None = None, priority: str = "offline-training",
           pool: str | None = None, state: JobState = JobState.PENDING, t: float = 0.0) -> JobRecord:
    spec = {"metadata": {"name": job_id, "priorityClass": priority},
            "spec": {"replicas": replicas, "template": {"command": ["x"], "resources": {"gpu": gpu}}}}
    if runtime is not None:
        spec["spec"]["runtimeSeconds"] = runtime
    if pool:
        spec["spec"]["template"]["nodeSelector"] = {"pool": pool}
    return JobRecord(job_id=job_id, spec=JobSpec.model_validate(spec), state=state, submitted_at=t, updated_at=t,
                     started_at=0.0 if state == JobState.RUNNING else None,
                     pods=[PodRecord(name=f"{job_id}-{i}", index=i) for i in range(replicas)])


def whole(node: str, gpus: list[int]) -> Allocation:
    return Allocation(node_id=node, gpu_indices=tuple(gpus), gpu_milli=(MILLI,) * len(gpus),
                      gpu_mem_mib=(81920,) * len(gpus), cpu_milli=1000, memory_mib=1024)


def state(nodes, running: dict, pending: list[JobRecord], **kw) -> CycleState:
    cluster = Cluster.from_descriptions(nodes)
    for _, allocs in running.values():
        for a in allocs:
            cluster.allocate(a)
    return CycleState(nodes=nodes, cluster=cluster, pending=pending, running=running, now=10.0, **kw)


def test_only_a_job_that_ends_in_time_backfills_in_front_of_a_blocked_gang() -> None:
    nodes = [small_node("n0", gpus=8), small_node("n1", gpus=8)]
    running = {"r": (record("r", 1, runtime=100, state=JobState.RUNNING), [whole("n0", [0])])}
    pending = [record("gang", 8, replicas=2, t=1), record("quick", 1, runtime=50, t=2), record("unknown", 1, t=3)]
    plan = plan_cycle(state(nodes, running, pending, min_runtime_s=1e9), Placer())
    assert [b.record.job_id for b in plan.binds] == ["quick"]  # ends at 60, before r (at 100)
    waiting = {r.job_id: u.reason for r, u in plan.not_placed}
    assert "earmarked 2 node(s)" in waiting["gang"] and "unknown" in waiting
    assert "it fits there once the 1 job(s) on them end (0 of them preemptible)" in waiting["gang"]


def test_priority_preemption_plan_is_the_minimal_whole_gang_and_nominates() -> None:
    nodes = [small_node("n0", gpus=8), small_node("n1", gpus=8)]
    running = {
        "big": (record("big", 4, replicas=2, state=JobState.RUNNING), [whole("n0", [0, 1, 2, 3]),
                                                                      whole("n0", [4, 5, 6, 7])]),
        "small": (record("small", 2, replicas=2, state=JobState.RUNNING), [whole("n1", [0, 1]), whole("n1", [2, 3])]),
        "other": (record("other", 4, state=JobState.RUNNING), [whole("n1", [4, 5, 6, 7])]),
    }
    serve = record("serve", 4, priority="online-serving", t=5)
    plan = plan_cycle(state(nodes, running, [serve], min_runtime_s=0), Placer())
    assert {p.job_id for p in plan.preemptions} in ({"small"}, {"other"})
    assert all(p.by == "serve" for p in plan.preemptions)
    assert "serve" in plan.nominations and not plan.binds


def test_tidal_return_is_planned_outside_the_window() -> None:
    nodes = [small_node("t0", gpus=8, pool="training"), small_node("i0", gpus=8, pool="inference")]
    lent = record("lent", 8, pool="training", state=JobState.RUNNING)
    running = {"lent": (lent, [whole("i0", list(range(8)))])}
    tides = parse_tides({"tides": [{"lend": "inference", "to": "training", "start": "22:00", "end": "07:00"}]})
    night = plan_cycle(state(nodes, running, [], tides=tides, wall=datetime.fromisoformat("2026-12-02T23:00")),
                       Placer())
    assert night.preemptions == []
    dawn = plan_cycle(state(nodes, running, [], tides=tides, wall=datetime.fromisoformat("2026-12-03T06:55")),
                      Placer())
    assert [(p.job_id, p.by) for p in dawn.preemptions] == [("lent", "tide")]
