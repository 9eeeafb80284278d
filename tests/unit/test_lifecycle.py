"""Fencing decisions (pure): which pod attempt is current, which exit counts, which start an agent refuses."""

from __future__ import annotations

import pytest
from tide.core.lifecycle import accepts_exit, pod_is_current, start_refusal
from tide.schemas.events import JobRecord, PodRecord, PodState
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
