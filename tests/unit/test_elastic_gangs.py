"""Elastic gangs and gang timeouts over ``plan_cycle`` (Volcano minAvailable / YuniKorn gang semantics):
a job with replicas > minMember starts on its minMember pods and takes its extras where room is left
after every pending job; extras are the first victims, stopped pod by pod while the job keeps running;
a gang pending past ``gangTimeoutSeconds`` fails or shrinks to minMember 1."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from tide.core import Cluster, Placer
from tide.core.cycle import CycleState, Plan, plan_cycle
from tide.core.lifecycle import mark_pod_exited, mark_pod_started
from tide.core.model import Allocation
from tide.schemas.events import ExitReason, JobRecord, JobState, PodExited, PodRecord, PodState
from tide.schemas.job import JobSpec
from tide.schemas.node import NodeDescription

from tests.helpers import small_node


def spec(name: str, gpu: int = 1, replicas: int = 1, min_member: int | None = None,
         priority: str = "offline-training", timeout: int | None = None, on_timeout: str | None = None) -> JobSpec:
    body: dict = {"replicas": replicas, "template": {"command": ["x"], "resources": {"gpu": gpu}}}
    if min_member is not None:
        body["minMember"] = min_member
    if timeout is not None:
        body["gangTimeoutSeconds"] = timeout
    if on_timeout is not None:
        body["onTimeout"] = on_timeout
    return JobSpec.model_validate({"metadata": {"name": name, "priorityClass": priority}, "spec": body})


class Elastic:
    """Carries out plans pod by pod as the placer does: binds and grows start at once; a preempted job
    or extra keeps its GPUs until the next cycle, then the job is requeued or the extra wants placement."""

    def __init__(self, nodes: list[NodeDescription], now: float = 1000.0) -> None:
        self.nodes, self.now = nodes, now
        self.cluster = Cluster.from_descriptions(nodes)
        self.records: dict[str, JobRecord] = {}
        self.allocs: dict[str, dict[int, Allocation]] = {}  # job -> pod index -> allocation
        self.stopping: list[tuple[str, int | None]] = []
        self.plans: list[Plan] = []

    def submit(self, job_spec: JobSpec, job_id: str, submitted_at: float | None = None) -> JobRecord:
        at = self.now if submitted_at is None else submitted_at
        record = JobRecord(job_id=job_id, spec=job_spec, submitted_at=at, updated_at=at,
                           pods=[PodRecord(name=f"{job_id}-{i}", index=i) for i in range(job_spec.spec.gang_size)])
        self.records[job_id] = record
        return record

    def state(self) -> CycleState:
        running = {j: (self.records[j], list(a.values())) for j, a in self.allocs.items() if a}
        pending = [r for r in self.records.values() if r.state in (JobState.PENDING, JobState.UNSCHEDULABLE)
                   and r.job_id not in running]
        extras = {j: {i: a for i, a in allocs.items() if i >= self.records[j].spec.spec.gang_size}
                  for j, allocs in self.allocs.items()}
        return CycleState(nodes=self.nodes, cluster=self.cluster, pending=pending, running=running, now=self.now,
                          min_runtime_s=0.0, extra_allocs={j: e for j, e in extras.items() if e})

    def cycle(self) -> Plan:
        for job_id, index in self.stopping:  # last cycle's victims are gone now
            record = self.records[job_id]
            for i in ([index] if index is not None else list(self.allocs[job_id])):
                self.cluster.release(self.allocs[job_id].pop(i))
                pod = next(p for p in record.pods if p.index == i)
                if index is not None:
                    assert mark_pod_exited(record, PodExited(node_id=pod.node or "", job_id=job_id, pod=pod.name,
                                                             exit_code=None, reason=ExitReason.STOPPED)) == (None, [])
                else:
                    pod.node, pod.state = None, PodState.PENDING
            if index is None:
                record.state = JobState.PENDING
        self.stopping = []
        state = self.state()
        snapshot = {j: (r, list(allocs)) for j, (r, allocs) in state.running.items()}
        plan = plan_cycle(state, Placer())
        # the planner changes a map of its own, never the snapshot's lists (the live placer's view keeps them
        # across cycles): a preempted extra pod leaves a copy of its job's list
        assert state.running == snapshot
        for p in plan.preemptions:
            record = self.records[p.job_id]
            if p.pods:
                for i in p.pods:
                    next(q for q in record.pods if q.index == i).stopping = True
                    self.stopping.append((p.job_id, i))
            else:
                record.state = JobState.PREEMPTED
                self.stopping.append((p.job_id, None))
        for job_id in plan.nominations:
            self.records[job_id].nominated_at = self.now
        for t in plan.timed_out:
            record = self.records[t.record.job_id]
            if t.action == "fail":
                record.state, record.reason = JobState.FAILED, t.reason
            else:
                assert t.spec is not None
                record.spec = t.spec
        for b in plan.binds:
            record = self.records[b.record.job_id]
            record.spec = b.record.spec
            record.nominated_at = None
            self._start(record, b.placements)
            record.started_at = self.now
        for g in plan.grows:
            self._start(self.records[g.record.job_id], g.placements)
        for record, unfit in plan.not_placed:
            self.records[record.job_id].reason = unfit.reason
        self.plans.append(plan)
        self.now += 1.0
        return plan

    def _start(self, record: JobRecord, placements: list) -> None:
        by_index = {p.index: p for p in record.pods}
        for pl in placements:
            pod = by_index.get(pl.pod_index)
            if pod is None:
                pod = PodRecord(name=f"{record.job_id}-{pl.pod_index}", index=pl.pod_index)
                record.pods.append(pod)
                by_index[pod.index] = pod
            pod.node, pod.state = pl.alloc.node_id, PodState.STARTING
            self.cluster.allocate(pl.alloc)
            self.allocs.setdefault(record.job_id, {})[pl.pod_index] = pl.alloc
        record.pods.sort(key=lambda p: p.index)
        for pl in placements:
            mark_pod_started(record, by_index[pl.pod_index].name)

    def pods(self, job_id: str) -> list[int]:
        return sorted(self.allocs.get(job_id, {}))


# ---------------------------------------------------------------- elastic gangs
def test_an_elastic_job_starts_with_as_many_extras_as_fit() -> None:
    drive = Elastic([small_node("n0", gpus=3)])
    drive.submit(spec("el", replicas=4, min_member=2), "el")
    plan = drive.cycle()
    assert [p.pod_index for p in plan.binds[0].placements] == [0, 1, 2]
    assert drive.records["el"].state == JobState.RUNNING
    assert drive.pods("el") == [0, 1, 2]


def test_an_elastic_job_waits_for_its_min_member_pods_only() -> None:
    drive = Elastic([small_node("n0", gpus=2)])
    drive.submit(spec("other", gpu=1), "other", submitted_at=0.0)
    drive.cycle()
    drive.submit(spec("el", replicas=4, min_member=2), "el")
    plan = drive.cycle()
    assert plan.binds == [] and "free capacity holds 1" in plan.not_placed[0][1].reason


def test_extras_rank_after_every_pending_job() -> None:
    # the elastic job is first in the order, yet a pending job that fits takes the room before its extras
    drive = Elastic([small_node("n0", gpus=4)])
    drive.submit(spec("el", replicas=4, min_member=2), "el", submitted_at=1.0)
    drive.submit(spec("small", gpu=1), "small", submitted_at=2.0)
    plan = drive.cycle()
    assert {b.record.job_id: len(b.placements) for b in plan.binds} == {"el": 3, "small": 1}


def test_no_extras_while_a_pending_job_waits_for_room() -> None:
    drive = Elastic([small_node("n0", gpus=4)])
    drive.submit(spec("el", replicas=4, min_member=2), "el", submitted_at=1.0)
    drive.submit(spec("big", gpu=3), "big", submitted_at=2.0)
    plan = drive.cycle()
    assert [len(b.placements) for b in plan.binds] == [2]
    assert [r.job_id for r, _ in plan.not_placed] == ["big"] and plan.grows == []


def test_a_running_elastic_job_grows_into_room_that_frees_up() -> None:
    drive = Elastic([small_node("n0", gpus=4)])
    drive.submit(spec("other", gpu=2), "other", submitted_at=1.0)
    drive.submit(spec("el", replicas=4, min_member=2), "el", submitted_at=2.0)
    drive.cycle()
    assert drive.pods("el") == [0, 1]
    for i in list(drive.allocs["other"]):  # other ends
        drive.cluster.release(drive.allocs["other"].pop(i))
    drive.records["other"].state = JobState.SUCCEEDED
    plan = drive.cycle()
    assert [(g.record.job_id, [p.pod_index for p in g.placements]) for g in plan.grows] == [("el", [2, 3])]
    assert drive.pods("el") == [0, 1, 2, 3]
    assert drive.cycle().grows == []  # nothing missing: nothing more


def test_a_higher_priority_job_preempts_only_the_extra_pods() -> None:
    drive = Elastic([small_node("n0", gpus=4)])
    drive.submit(spec("el", replicas=4, min_member=2), "el")
    drive.cycle()
    assert drive.pods("el") == [0, 1, 2, 3]
    drive.submit(spec("serve", gpu=1, priority="online-serving"), "serve")
    plan = drive.cycle()
    assert len(plan.preemptions) == 1
    victim = plan.preemptions[0]
    assert victim.job_id == "el" and len(victim.pods) == 1 and victim.pods[0] >= 2
    assert drive.records["el"].state == JobState.RUNNING
    assert "el pod" in plan.nominations["serve"]
    plan = drive.cycle()  # the extra is gone: serve starts, el keeps running on 3 pods
    assert [b.record.job_id for b in plan.binds] == ["serve"]
    assert drive.records["el"].state == JobState.RUNNING and len(drive.pods("el")) == 3
    stopped = next(p for p in drive.records["el"].pods if p.index == victim.pods[0])
    assert stopped.state == PodState.PENDING and stopped.node is None  # it wants placement again
    assert drive.cycle().grows == []  # no room for it


def test_extras_go_before_a_lower_priority_whole_job() -> None:
    # a best-effort single pod and an elastic job's extra: the extra of the higher-priority job goes first
    drive = Elastic([small_node("n0", gpus=4)])
    drive.submit(spec("be", gpu=1, priority="best-effort"), "be", submitted_at=1.0)
    drive.submit(spec("el", replicas=3, min_member=2), "el", submitted_at=2.0)
    drive.cycle()
    assert drive.pods("el") == [0, 1, 2] and drive.pods("be") == [0]
    drive.submit(spec("serve", gpu=1, priority="online-serving"), "serve")
    plan = drive.cycle()
    assert [(p.job_id, p.pods) for p in plan.preemptions] == [("el", (2,))]


def test_a_job_needing_more_than_the_extras_takes_the_whole_job() -> None:
    drive = Elastic([small_node("n0", gpus=4)])
    drive.submit(spec("el", replicas=3, min_member=2, priority="best-effort"), "el")
    drive.cycle()
    assert drive.pods("el") == [0, 1, 2]
    drive.submit(spec("big", gpu=4), "big")
    assert drive.cycle().preemptions == []  # not before its class's preemption delay (30 s)
    drive.now += 30
    plan = drive.cycle()
    assert [(p.job_id, p.pods) for p in plan.preemptions] == [("el", ())]


def test_elastic_outcome_stopped_extra_is_not_a_failure() -> None:
    record = JobRecord(job_id="j", spec=spec("j", replicas=3, min_member=2), submitted_at=0.0, updated_at=0.0,
                       state=JobState.RUNNING,
                       pods=[PodRecord(name=f"j-{i}", index=i, node="n", state=PodState.RUNNING) for i in range(3)])

    def exit_(pod: str, code: int | None, reason: ExitReason) -> tuple:
        return mark_pod_exited(record, PodExited(node_id="n", job_id="j", pod=pod, exit_code=code, reason=reason))

    assert exit_("j-2", None, ExitReason.STOPPED) == (None, [])
    assert record.pods[2].state == PodState.PENDING and record.pods[2].node is None
    assert exit_("j-0", 0, ExitReason.COMPLETED) == (None, [])
    assert exit_("j-1", 0, ExitReason.COMPLETED) == (JobState.SUCCEEDED, [])


# ---------------------------------------------------------------- gang timeout
def test_a_gang_past_its_timeout_fails_and_releases_its_earmark_in_the_same_cycle() -> None:
    drive = Elastic([small_node("n0", gpus=4), small_node("n1", gpus=4)])
    drive.submit(spec("long", gpu=3), "long-a", submitted_at=1.0)
    drive.submit(spec("long", gpu=3), "long-b", submitted_at=1.0)
    drive.cycle()
    drive.submit(spec("gang", gpu=3, replicas=2, timeout=5), "gang")
    drive.submit(spec("small", gpu=1), "small")
    plan = drive.cycle()
    assert [r.job_id for r, _ in plan.not_placed] == ["gang", "small"]  # small may not use the earmark
    assert "earmarked" in plan.not_placed[0][1].reason
    drive.now += 10
    plan = drive.cycle()
    assert [(t.record.job_id, t.action) for t in plan.timed_out] == [("gang", "fail")]
    assert plan.timed_out[0].reason == "gang timeout: 2 of 2 pods could not be placed within 5s"
    assert [b.record.job_id for b in plan.binds] == ["small"]  # the earmark went with it
    assert drive.records["gang"].state == JobState.FAILED


def test_a_gang_within_its_timeout_or_placeable_does_not_time_out() -> None:
    drive = Elastic([small_node("n0", gpus=4)])
    drive.submit(spec("gang", gpu=1, replicas=2, timeout=5), "gang", submitted_at=0.0)
    plan = drive.cycle()  # waited 1000 s, but it fits
    assert plan.timed_out == [] and [b.record.job_id for b in plan.binds] == ["gang"]
    drive = Elastic([small_node("n0", gpus=2)])
    drive.submit(spec("other", gpu=1), "other", submitted_at=0.0)
    drive.submit(spec("gang", gpu=1, replicas=2, timeout=5), "gang")
    assert drive.cycle().timed_out == []


def test_a_gang_that_times_out_with_shrink_starts_with_what_fits() -> None:
    drive = Elastic([small_node("n0", gpus=3)])
    drive.submit(spec("gang", gpu=1, replicas=4, timeout=5, on_timeout="shrink"), "gang", submitted_at=0.0)
    plan = drive.cycle()
    assert [(t.record.job_id, t.action) for t in plan.timed_out] == [("gang", "shrink")]
    assert plan.timed_out[0].reason.startswith("gang timeout: 1 of 4 pods could not be placed within 5s")
    assert plan.timed_out[0].spec is not None and plan.timed_out[0].spec.spec.gang_size == 1
    assert [p.pod_index for p in plan.binds[0].placements] == [0, 1, 2]
    assert drive.records["gang"].state == JobState.RUNNING and drive.records["gang"].spec.spec.gang_size == 1


def test_timeout_is_measured_from_the_last_queueing() -> None:
    drive = Elastic([small_node("n0", gpus=2)])
    drive.submit(spec("other", gpu=1), "other", submitted_at=0.0)
    record = drive.submit(spec("gang", gpu=1, replicas=2, timeout=5), "gang", submitted_at=0.0)
    record.queued_at = drive.now - 1
    assert drive.cycle().timed_out == []


@pytest.mark.parametrize("body, field", [
    ({"gangTimeoutSeconds": 0}, "gangTimeoutSeconds"),
    ({"gangTimeoutSeconds": "x"}, "gangTimeoutSeconds"),
    ({"onTimeout": "retry"}, "onTimeout"),
])
def test_timeout_fields_are_validated_by_name(body: dict, field: str) -> None:
    valid = {"metadata": {"name": "j"}, "spec": {"replicas": 2, "template": {"command": ["x"]},
                                                 "gangTimeoutSeconds": 30, "onTimeout": "shrink"}}
    assert JobSpec.model_validate(valid).spec.on_timeout == "shrink"
    raw = {**valid, "spec": {**valid["spec"], **body}}
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(raw)
    assert field in str(info.value)


# ---------------------------------------------------------------- the replay carries the plans out
def test_the_replay_runs_extras_and_fails_a_timed_out_gang() -> None:
    from tide.sim.replay import FULL, Replay
    from tide.sim.replay_workload import ReplayJob, Workload, WorkloadConfig

    jobs = [ReplayJob("el", spec("el", replicas=4, min_member=2), 0.0, 3600.0, "offline-training"),
            ReplayJob("strict", spec("strict", replicas=2, timeout=60), 10.0, 600.0, "offline-training"),
            ReplayJob("soft", spec("soft", replicas=2, timeout=60, on_timeout="shrink"), 20.0, 600.0,
                      "offline-training")]
    run = Replay(Workload([small_node("n0", gpus=4)], jobs, {}, 1800.0, WorkloadConfig(horizon_s=1800.0)), FULL)
    run.run()
    el, strict, soft = run.records["el"], run.records["strict"], run.records["soft"]
    assert el.state == JobState.RUNNING
    assert strict.state == JobState.FAILED and strict.reason.startswith("gang timeout: 2 of 2 pods")
    assert soft.spec.spec.gang_size == 1 and soft.state == JobState.PENDING  # shrunk; waits for one GPU
    assert sorted(p.index for p in el.pods if p.node) == [0, 1, 2, 3]


def test_extras_placed_later_carry_their_own_fencing_token() -> None:
    from tide.core.lifecycle import extras_attempt, holds_attempt, live_floor, pod_is_current

    record = JobRecord(job_id="j", spec=spec("j", replicas=3, min_member=2), submitted_at=0.0, updated_at=0.0,
                       state=JobState.RUNNING, attempts=2,
                       pods=[PodRecord(name="j-0", index=0, node="a", state=PodState.RUNNING, attempt=1),
                             PodRecord(name="j-1", index=1, node="a", state=PodState.RUNNING, attempt=1),
                             PodRecord(name="j-2", index=2, node="b", state=PodState.STARTING, attempt=2)])
    assert pod_is_current(record, "j-0", 1, "a") and not pod_is_current(record, "j-0", 2, "a")
    assert pod_is_current(record, "j-2", 2, "b") and not pod_is_current(record, "j-2", 1, "b")
    assert live_floor(record) == 1
    assert extras_attempt(record, 2) and not extras_attempt(record, 1)  # undoing 2 leaves the gang running
    assert holds_attempt(record, 1) and holds_attempt(record, 2) and not holds_attempt(record, 3)
