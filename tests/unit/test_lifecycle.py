"""The job and pod state machine (pure): fencing decisions (which pod attempt is current, which exit counts,
which start an agent refuses) and every job transition, as tables."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tide.core.lifecycle import (
    accepts_exit,
    can_roll_back,
    commit,
    finish_cancel,
    gang_timed_out,
    gpus_overcommitted,
    mark_unplaced,
    nominate,
    pod_exited,
    pod_fate,
    pod_is_current,
    pod_started,
    preempt,
    preempt_extras,
    request_cancel,
    requeue_preempted,
    reserve,
    reserve_extras,
    rollback,
    rollback_extras,
    start_refusal,
)
from tide.schemas.events import (
    ExitReason,
    GpuAssignment,
    JobRecord,
    JobState,
    PodExited,
    PodFate,
    PodRecord,
    PodState,
)
from tide.schemas.job import JobSpec


def record(attempts: int = 2, node: str | None = "n1", state: PodState = PodState.RUNNING) -> JobRecord:
    spec = JobSpec.model_validate({"metadata": {"name": "j"}, "spec": {"template": {"command": ["x"]}}})
    return JobRecord(job_id="j", spec=spec, submitted_at=0, updated_at=0, attempts=attempts,
                     pods=[PodRecord(name="j-0", index=0, node=node, state=state)])


@pytest.mark.parametrize(("rec", "pod", "attempt", "node", "current"), [
    (record(), "j-0", 2, "n1", True),
    (record(state=PodState.STARTING), "j-0", 2, "n1", True),  # started before its pod-started is handled
    (record(), "j-0", 1, "n1", False),  # an attempt rolled back: the token moved on
    (record(), "j-0", 3, "n1", False),  # a token the record never issued
    (record(), "j-0", 2, "n2", False),  # the record places it elsewhere
    (record(node=None, state=PodState.PENDING), "j-0", 2, "n1", False),  # requeued, not placed yet
    (record(state=PodState.STOPPED), "j-0", 2, "n1", False),  # counted as exited already
    (record(state=PodState.SUCCEEDED), "j-0", 2, "n1", False),
    (record(), "j-9", 2, "n1", False),  # no such pod
    (None, "j-0", 1, "n1", False),  # no such job
])
def test_pod_is_current(rec: JobRecord | None, pod: str, attempt: int, node: str, current: bool) -> None:
    assert pod_is_current(rec, pod, attempt, node) is current
    assert accepts_exit(rec, pod, attempt, node) is current


@pytest.mark.parametrize(("attempt", "floor", "expires_at", "now", "refused"), [
    (2, 0, None, 100.0, ""),
    (2, 2, 101.0, 100.0, ""),
    (1, 2, None, 100.0, "older than attempt 2"),
    (2, 3, 101.0, 100.0, "older than attempt 3"),  # told to stop attempt 2 before its start came
    (2, 0, 99.0, 100.0, "expired 1.0s ago"),  # the placer gave up waiting for it
])
def test_start_refusal(attempt: int, floor: int, expires_at: float | None, now: float, refused: str) -> None:
    why = start_refusal(attempt, floor, expires_at, now)
    assert (refused in why and why) if refused else why == ""


@pytest.mark.parametrize(("running", "exited", "fate"), [
    ({"j/j-0.a2"}, set(), PodFate.RUNNING),
    (set(), {"j/j-0.a2"}, PodFate.EXITED),  # a short pod ended before the question came
    ({"j/j-0.a1"}, {"j/j-1.a2"}, PodFate.ABSENT),  # another attempt, another pod: this one never started
    (set(), set(), PodFate.ABSENT),
])
def test_pod_fate(running: set[str], exited: set[str], fate: PodFate) -> None:
    assert pod_fate("j/j-0.a2", running, exited) is fate


# ---------------------------------------------------------------- job transitions (table)
NOW = 1000.0
Pod = tuple[int, str | None, PodState, int | None]  # index, node, state, token (None: the job's attempt)


def job(state: JobState = JobState.RUNNING, attempts: int = 2, pods: tuple[Pod, ...] = ((0, "n1", PodState.RUNNING,
        None),), replicas: int = 1, min_member: int | None = None, reservation: str | None = None,
        cancel: bool = False, avoid: tuple[str, ...] = ()) -> JobRecord:
    gang = {"replicas": replicas} | ({"minMember": min_member} if min_member else {})
    spec = JobSpec.model_validate({"metadata": {"name": "j"}, "spec": {"template": {"command": ["x"]}, **gang}})
    return JobRecord(job_id="j", spec=spec, submitted_at=0, updated_at=0, state=state, attempts=attempts,
                     reservation=reservation, cancel_requested=cancel, avoid_nodes=list(avoid),
                     pods=[PodRecord(name=f"j-{i}", index=i, node=node, state=s, attempt=token)
                           for i, node, s, token in pods])


UNPLACED = ((0, None, PodState.PENDING, None),)
STARTING = ((0, "n1", PodState.STARTING, 2),)
GANG_AND_EXTRA = ((0, "n1", PodState.RUNNING, 2), (1, "n2", PodState.RUNNING, 3))  # minMember 1, extra of attempt 3
EXTRAS_WANTED = ((0, "n1", PodState.RUNNING, None), (1, None, PodState.PENDING, None))


def exit_of(pod: str, node: str = "n1", code: int | None = 0, reason: ExitReason = ExitReason.COMPLETED) -> PodExited:
    return PodExited(node_id=node, job_id="j", pod=pod, exit_code=code, reason=reason)


def shrunk() -> JobSpec:
    return job(replicas=4, min_member=1).spec


# (case, record before, transition, applies, job state after)
TRANSITIONS = [
    ("reserve waiting", job(JobState.PENDING, 1, UNPLACED), lambda r: reserve(r, 2, "j:2", {0: ("n1", ["g0"])},
                                                                           r.spec), True, JobState.PENDING),
    ("reserve unschedulable", job(JobState.UNSCHEDULABLE, 1, ()), lambda r: reserve(r, 2, "j:2", {0: ("n1", [])},
                                                                                  r.spec), True, JobState.PENDING),
    ("reserve, gang shrunk meanwhile", job(JobState.PENDING, 1, (), replicas=4), lambda r: reserve(
        r, 2, "j:2", {0: ("n1", [])}, shrunk()), False, JobState.PENDING),
    ("reserve after another attempt", job(JobState.PENDING, 2, UNPLACED), lambda r: reserve(
        r, 2, "j:2", {0: ("n1", [])}, r.spec), False, JobState.PENDING),
    ("reserve cancelling job", job(JobState.PENDING, 1, UNPLACED, cancel=True), lambda r: reserve(
        r, 2, "j:2", {0: ("n1", [])}, r.spec), False, JobState.PENDING),
    ("reserve running job", job(JobState.RUNNING, 1), lambda r: reserve(r, 2, "j:2", {0: ("n1", [])}, r.spec),
     False, JobState.RUNNING),
    ("reserve extras", job(JobState.RUNNING, 1, EXTRAS_WANTED, replicas=2, min_member=1), lambda r: reserve_extras(
        r, 2, "j:2", {1: ("n2", [])}), True, JobState.RUNNING),
    ("reserve extras of a waiting job", job(JobState.PENDING, 1, UNPLACED, replicas=2, min_member=1),
     lambda r: reserve_extras(r, 2, "j:2", {1: ("n2", [])}), False, JobState.PENDING),
    ("reserve extras already placed", job(JobState.RUNNING, 3, GANG_AND_EXTRA, replicas=2, min_member=1),
     lambda r: reserve_extras(r, 4, "j:4", {1: ("n3", [])}), False, JobState.RUNNING),
    ("reserve extras, reservation open", job(JobState.RUNNING, 1, EXTRAS_WANTED, 2, 1, reservation="j:1"),
     lambda r: reserve_extras(r, 2, "j:2", {1: ("n2", [])}), False, JobState.RUNNING),
    ("commit", job(JobState.RUNNING, reservation="j:2", avoid=("n9",)), lambda r: commit(r, "j:2"), True,
     JobState.RUNNING),
    ("commit a rolled-back attempt", job(JobState.PENDING, 2, UNPLACED), lambda r: commit(r, "j:2"), False,
     JobState.PENDING),
    ("commit an older attempt", job(JobState.PENDING, 3, STARTING, reservation="j:3"), lambda r: commit(r, "j:2"),
     False, JobState.PENDING),
    ("roll back a starting attempt", job(JobState.PENDING, 2, STARTING, reservation="j:2"), lambda r: rollback(
        r, 2, "start failed", {"n1"}, 4.0, NOW), True, JobState.PENDING),
    ("roll back a running job (node lost)", job(JobState.RUNNING, 2), lambda r: rollback(
        r, 2, "pod lost", {"n1"}, 4.0, NOW), True, JobState.PENDING),
    ("roll back an older attempt", job(JobState.PENDING, 3, ((0, "n1", PodState.STARTING, 3),), reservation="j:3"),
     lambda r: rollback(r, 2, "late", set(), 4.0, NOW), False, JobState.PENDING),
    ("roll back a finished job", job(JobState.SUCCEEDED, 2, ((0, "n1", PodState.SUCCEEDED, None),)),
     lambda r: rollback(r, 2, "late", set(), 4.0, NOW), False, JobState.SUCCEEDED),
    ("roll back extras", job(JobState.RUNNING, 3, GANG_AND_EXTRA, 2, 1, reservation="j:3"), lambda r: rollback_extras(
        r, 3, "j:3", {"n2"}), True, JobState.RUNNING),
    ("roll back extras: the gang's attempt", job(JobState.RUNNING, 3, GANG_AND_EXTRA, 2, 1), lambda r: rollback_extras(
        r, 2, "j:2", set()), False, JobState.RUNNING),
    ("preempt", job(JobState.RUNNING), lambda r: preempt(r, "hi", "priority"), True, JobState.PREEMPTED),
    ("preempt a waiting job", job(JobState.PENDING, 2, STARTING), lambda r: preempt(r, "hi", "priority"), False,
     JobState.PENDING),
    ("preempt a preempted job", job(JobState.PREEMPTED), lambda r: preempt(r, "hi", "priority"), False,
     JobState.PREEMPTED),
    ("preempt extras", job(JobState.RUNNING, 3, GANG_AND_EXTRA, 2, 1), lambda r: preempt_extras(
        r, (1,), "hi", "fit"), True, JobState.RUNNING),
    ("preempt extras: a gang pod", job(JobState.RUNNING, 3, GANG_AND_EXTRA, 2, 1), lambda r: preempt_extras(
        r, (0,), "hi", "fit"), False, JobState.RUNNING),
    ("preempt extras of a cancelling job", job(JobState.RUNNING, 3, GANG_AND_EXTRA, 2, 1, cancel=True),
     lambda r: preempt_extras(r, (1,), "hi", "fit"), False, JobState.RUNNING),
    ("requeue preempted", job(JobState.PREEMPTED, 2, ((0, "n1", PodState.STOPPED, None),)),
     lambda r: requeue_preempted(r, NOW), True, JobState.PENDING),
    ("requeue preempted, a pod still runs", job(JobState.PREEMPTED), lambda r: requeue_preempted(r, NOW), False,
     JobState.PREEMPTED),
    ("requeue a running job", job(JobState.RUNNING, 2, ((0, "n1", PodState.STOPPED, None),)),
     lambda r: requeue_preempted(r, NOW), False, JobState.RUNNING),
    ("cancel a waiting job", job(JobState.PENDING, 0, UNPLACED), lambda r: request_cancel(r, "user", NOW), True,
     JobState.CANCELLED),
    ("cancel a running job", job(JobState.RUNNING), lambda r: request_cancel(r, "user", NOW), True,
     JobState.RUNNING),
    ("cancel a starting job", job(JobState.PENDING, 2, STARTING), lambda r: request_cancel(r, "user", NOW), True,
     JobState.PENDING),
    ("cancel a finished job", job(JobState.SUCCEEDED), lambda r: request_cancel(r, "user", NOW), False,
     JobState.SUCCEEDED),
    ("cancel twice", job(JobState.RUNNING, cancel=True), lambda r: request_cancel(r, "user", NOW), False,
     JobState.RUNNING),
    ("finish a cancel", job(JobState.RUNNING, 2, ((0, "n1", PodState.STOPPED, None),), cancel=True),
     lambda r: finish_cancel(r, NOW), True, JobState.CANCELLED),
    ("finish a cancel of a failed job", job(JobState.FAILED, cancel=True), lambda r: finish_cancel(r, NOW), False,
     JobState.FAILED),
    ("nominate", job(JobState.PENDING, 0, UNPLACED), lambda r: nominate(r, "preempting", NOW), True,
     JobState.PENDING),
    ("not placed: unschedulable", job(JobState.PENDING, 0, UNPLACED), lambda r: mark_unplaced(
        r, JobState.UNSCHEDULABLE, "no fit"), True, JobState.UNSCHEDULABLE),
    ("not placed: reserved meanwhile", job(JobState.PENDING, 2, STARTING, reservation="j:2"), lambda r: mark_unplaced(
        r, JobState.UNSCHEDULABLE, "no fit"), False, JobState.PENDING),
    ("not placed: running", job(JobState.RUNNING), lambda r: mark_unplaced(r, JobState.PENDING, "no fit"), False,
     JobState.RUNNING),
    ("gang timeout: fail", job(JobState.PENDING, 0, UNPLACED), lambda r: gang_timed_out(
        r, r.spec, "fail", None, "gang timeout", NOW), True, JobState.FAILED),
    ("gang timeout: shrink", job(JobState.PENDING, 0, (), replicas=4), lambda r: gang_timed_out(
        r, r.spec, "shrink", shrunk(), "gang timeout", NOW), True, JobState.PENDING),
    ("gang timeout: spec changed", job(JobState.PENDING, 0, (), replicas=4), lambda r: gang_timed_out(
        r, shrunk(), "fail", None, "gang timeout", NOW), False, JobState.PENDING),
    ("gang timeout: cancelling", job(JobState.PENDING, 0, UNPLACED, cancel=True), lambda r: gang_timed_out(
        r, r.spec, "fail", None, "gang timeout", NOW), False, JobState.PENDING),
    ("pod started", job(JobState.PENDING, 2, STARTING), lambda r: pod_started(r, "j-0", 2, "n1", NOW) is not None,
     True, JobState.RUNNING),
    ("pod started, older attempt", job(JobState.PENDING, 2, STARTING), lambda r: pod_started(
        r, "j-0", 1, "n1", NOW) is not None, False, JobState.PENDING),
    ("pod started, other node", job(JobState.PENDING, 2, STARTING), lambda r: pod_started(
        r, "j-0", 2, "n2", NOW) is not None, False, JobState.PENDING),
    ("pod exited", job(JobState.RUNNING), lambda r: pod_exited(r, exit_of("j-0"), 2, NOW) is not None, True,
     JobState.SUCCEEDED),
    ("pod exited, older attempt", job(JobState.RUNNING), lambda r: pod_exited(
        r, exit_of("j-0"), 1, NOW) is not None, False, JobState.RUNNING),
    ("pod exited twice", job(JobState.RUNNING, 2, ((0, "n1", PodState.FAILED, None),)), lambda r: pod_exited(
        r, exit_of("j-0"), 2, NOW) is not None, False, JobState.RUNNING),
]


@pytest.mark.parametrize(("rec", "transition", "applies", "after"), [t[1:] for t in TRANSITIONS],
                         ids=[t[0] for t in TRANSITIONS])
def test_transition(rec: JobRecord, transition: Callable[[JobRecord], object], applies: bool,
                    after: JobState) -> None:
    before = rec.model_dump()
    assert bool(transition(rec)) is applies
    assert rec.state == after
    if not applies:
        assert rec.model_dump() == before  # a refused transition changes nothing


def test_reserve_records_the_attempt() -> None:
    r = job(JobState.PENDING, 1, UNPLACED)
    r.nominated_at = 5.0
    assert reserve(r, 2, "j:2", {0: ("n1", ["g0"]), 1: ("n2", ["g1"])}, r.spec)
    assert (r.reason, r.attempts, r.reservation, r.nominated_at) == ("starting", 2, "j:2", None)
    assert [(p.name, p.node, p.state, p.attempt, p.gpus) for p in r.pods] == [
        ("j-0", "n1", PodState.STARTING, 2, ["g0"]), ("j-1", "n2", PodState.STARTING, 2, ["g1"])]


def test_reserve_adopts_a_shrunk_gang_spec() -> None:
    r = job(JobState.PENDING, 1, ())
    assert reserve(r, 2, "j:2", {0: ("n1", [])}, shrunk()) and r.spec == shrunk()


def test_reserve_extras_keeps_the_gangs_token() -> None:
    r = job(JobState.RUNNING, 1, EXTRAS_WANTED, replicas=2, min_member=1)
    assert reserve_extras(r, 2, "j:2", {1: ("n2", [])})
    assert [(p.node, p.state, p.attempt) for p in r.pods] == [("n1", PodState.RUNNING, 1),
                                                              ("n2", PodState.STARTING, 2)]
    assert (r.attempts, r.reservation, r.reason) == (2, "j:2", "")


def test_commit_clears_the_avoided_nodes() -> None:
    r = job(reservation="j:2", avoid=("n9",))
    assert commit(r, "j:2") and (r.reservation, r.avoid_nodes) == (None, [])


def test_rollback_backs_off_and_avoids_the_bad_nodes() -> None:
    r = job(JobState.PENDING, 2, STARTING, reservation="j:2", avoid=("n9",))
    assert rollback(r, 2, "start failed", {"n1"}, 4.0, NOW)
    assert (r.reason, r.reservation, r.not_before, r.queued_at, r.avoid_nodes) == (
        "requeued: start failed", None, NOW + 4.0, NOW, ["n1", "n9"])
    assert [(p.node, p.state, p.attempt) for p in r.pods] == [(None, PodState.PENDING, None)]
    assert not can_roll_back(r, 1) and can_roll_back(r, 2) and not can_roll_back(None, 2)


def test_rollback_extras_keeps_the_gang() -> None:
    r = job(JobState.RUNNING, 3, GANG_AND_EXTRA, 2, 1, reservation="j:3")
    assert rollback_extras(r, 3, "j:3", {"n2"})
    assert (r.reservation, r.avoid_nodes) == (None, ["n2"])
    assert [(p.node, p.state) for p in r.pods] == [("n1", PodState.RUNNING), (None, PodState.PENDING)]


def test_preemption_and_requeue() -> None:
    r = job(JobState.RUNNING)
    assert preempt(r, "hi", "priority")
    assert (r.reason, r.preempted_by, r.preemptions) == ("preempted by hi (priority)", "hi", 1)
    r.pods[0].state = PodState.STOPPED
    assert requeue_preempted(r, NOW)
    assert (r.reason, r.queued_at, r.pods[0].node) == ("requeued after preemption by hi", NOW, None)


def test_preempt_extras_names_the_pods_to_stop() -> None:
    r = job(JobState.RUNNING, 3, GANG_AND_EXTRA, 2, 1)
    assert preempt_extras(r, (0, 1), "hi", "fit") == [("j-1", "n2", 3)]
    assert r.pods[1].stopping and r.pods[1].reason == "preempted by hi (fit)" and not r.pods[0].stopping
    assert preempt_extras(r, (1,), "hi", "fit") == []  # already stopping


def test_cancel_timestamps() -> None:
    waiting = job(JobState.PENDING, 0, UNPLACED)
    assert request_cancel(waiting, "user", NOW) and (waiting.finished_at, waiting.reason) == (NOW, "user")
    running = job(JobState.RUNNING)
    assert request_cancel(running, "user", NOW) and running.cancel_requested and running.finished_at is None
    assert finish_cancel(running, NOW + 1) and running.finished_at == NOW + 1


def test_pod_transitions_use_the_clock() -> None:
    r = job(JobState.PENDING, 2, STARTING)
    assert pod_started(r, "j-0", 2, "n1", NOW) is True and r.started_at == NOW
    exited = exit_of("j-0").model_copy(update={"checkpointed": True, "ts": 7.0})
    assert pod_exited(r, exited, 2, NOW + 1) == (JobState.SUCCEEDED, [])
    assert (r.finished_at, r.last_checkpoint_at) == (NOW + 1, 7.0)


def test_nominate_and_gang_timeout() -> None:
    r = job(JobState.PENDING, 0, UNPLACED)
    assert nominate(r, "preempting", NOW) and (r.nominated_at, r.reason) == (NOW, "preempting")
    assert gang_timed_out(r, r.spec, "fail", None, "gang timeout", NOW) and r.finished_at == NOW


def _gpu(index: int, milli: int = 1000, mig: str | None = None) -> GpuAssignment:
    return GpuAssignment(index=index, uuid=f"GPU-{index}", milli=milli, mig_profile=mig)


def test_gpus_overcommitted_names_the_holders_of_a_gpu_that_would_pass_its_whole() -> None:
    held = {"a/a-0.a1": [_gpu(0)], "s/s-0.a1": [_gpu(1, 600)], "t/t-0.a1": [_gpu(1, 300)],
            "m/m-0.a1": [_gpu(2, mig="1g.10gb")]}
    assert gpus_overcommitted([_gpu(0)], held) == {"a/a-0.a1": [0]}
    assert gpus_overcommitted([_gpu(1, 100)], held) == {}  # 600 + 300 + 100 fits one GPU
    assert gpus_overcommitted([_gpu(1, 200)], held) == {"s/s-0.a1": [1], "t/t-0.a1": [1]}
    assert gpus_overcommitted([_gpu(2, mig="1g.10gb")], held) == {}  # MIG slices are the MIG table's
    assert gpus_overcommitted([_gpu(3), _gpu(0, 1)], held) == {"a/a-0.a1": [0]}
    assert gpus_overcommitted([], held) == {}
