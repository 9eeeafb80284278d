"""How pod starts and exits decide a job's state (pure)."""

from __future__ import annotations

from tide.core.lifecycle import mark_pod_exited, mark_pod_started
from tide.schemas.events import ExitReason, JobRecord, JobState, PodExited, PodRecord, PodState
from tide.schemas.job import JobSpec


def record(pods: int) -> JobRecord:
    spec = JobSpec.model_validate({"metadata": {"name": "j"}, "spec": {"replicas": pods,
                                                                       "template": {"command": ["x"]}}})
    return JobRecord(job_id="j", spec=spec, submitted_at=0, updated_at=0,
                     pods=[PodRecord(name=f"j-{i}", index=i, node="n", state=PodState.STARTING)
                           for i in range(pods)])


def exited(pod: str, code: int | None, reason: ExitReason = ExitReason.COMPLETED) -> PodExited:
    return PodExited(node_id="n", job_id="j", pod=pod, exit_code=code, reason=reason)


def test_job_runs_only_when_every_pod_runs() -> None:
    r = record(2)
    assert not mark_pod_started(r, "j-0") and r.state == JobState.PENDING
    assert mark_pod_started(r, "j-1") and r.state == JobState.RUNNING


def test_one_failed_pod_fails_the_job_and_stops_the_rest() -> None:
    r = record(3)
    for p in ("j-0", "j-1", "j-2"):
        mark_pod_started(r, p)
    state, to_stop = mark_pod_exited(r, exited("j-1", 2, ExitReason.ERROR))
    assert state == JobState.FAILED and "exited with code 2" in r.reason
    assert to_stop == ["j-0", "j-2"]
    # later exits of the stopped pods change nothing
    assert mark_pod_exited(r, exited("j-0", -15, ExitReason.STOPPED)) == (None, ["j-2"])
    assert r.state == JobState.FAILED


def test_oom_is_named_and_success_needs_every_pod() -> None:
    r = record(2)
    assert mark_pod_exited(r, exited("j-0", 0)) == (None, [])
    assert mark_pod_exited(r, exited("j-1", 0)) == (JobState.SUCCEEDED, [])
    r = record(1)
    state, _ = mark_pod_exited(r, exited("j-0", 1, ExitReason.OOM))
    assert state == JobState.FAILED and "OOM" in r.reason


def test_cancelled_job_ends_when_its_last_pod_stops() -> None:
    r = record(2)
    r.cancel_requested = True
    assert mark_pod_exited(r, exited("j-0", -15, ExitReason.STOPPED)) == (None, ["j-1"])
    assert mark_pod_exited(r, exited("j-1", -15, ExitReason.STOPPED)) == (JobState.CANCELLED, [])


def test_job_runs_when_the_last_pod_starts_even_if_another_already_finished() -> None:
    r = record(2)
    mark_pod_started(r, "j-0")
    assert mark_pod_exited(r, exited("j-0", 0)) == (None, [])
    assert mark_pod_started(r, "j-1") and r.state == JobState.RUNNING
    assert mark_pod_exited(r, exited("j-1", 0)) == (JobState.SUCCEEDED, [])
