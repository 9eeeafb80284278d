"""How a pod's start or exit changes its job (pure decisions on a JobRecord)."""

from __future__ import annotations

import time

from tide.schemas.events import POD_DONE_STATES, ExitReason, JobRecord, JobState, PodExited, PodRecord, PodState


def mark_pod_started(record: JobRecord, pod: str) -> bool:
    """Mark a pod running; the job turns running when every pod placed with its gang has started (elastic
    extras not placed yet do not count). Returns the job turned.

    A short pod may already have exited when the last one starts: started means running or done.
    """
    for p in record.pods:
        if p.name == pod and p.state in (PodState.PENDING, PodState.STARTING):
            p.state = PodState.RUNNING
    placed = [p for p in record.pods if p.node is not None or p.state != PodState.PENDING]
    started = bool(placed) and all(p.state == PodState.RUNNING or p.state in POD_DONE_STATES for p in placed)
    if record.state == JobState.PENDING and started:
        record.state = JobState.RUNNING
        record.reason = ""
        record.started_at = time.time()
        return True
    return False


def reset_pod(p: PodRecord) -> None:
    """The pod wants placement again (a requeue, a rollback, a stopped or lost elastic extra)."""
    p.node, p.gpus, p.state, p.exit_code, p.reason, p.stopping, p.attempt = None, [], PodState.PENDING, None, None, \
        False, None


def mark_pod_exited(record: JobRecord, exited: PodExited) -> tuple[JobState | None, list[str]]:
    """Record a pod's exit. Returns (the job's new terminal state or None, pods still to stop).

    Elastic jobs: an extra pod (index >= minMember) stopped while its job runs (a pod-level preemption)
    wants placement again; the job succeeds when its minMember pods succeeded and every other pod that
    ran exited 0 (a stopped extra is not a failure)."""
    gang = record.spec.spec.gang_size
    for p in record.pods:
        if (p.name == exited.pod and p.index >= gang and exited.reason in (ExitReason.STOPPED, ExitReason.LOST)
                and record.state == JobState.RUNNING and not record.cancel_requested):
            reset_pod(p)
            return None, []
        if p.name == exited.pod and p.state not in POD_DONE_STATES:
            p.exit_code = exited.exit_code
            p.reason = exited.reason.value
            if exited.reason == ExitReason.STOPPED:
                p.state = PodState.STOPPED
            elif exited.reason == ExitReason.COMPLETED and exited.exit_code == 0:
                p.state = PodState.SUCCEEDED
            else:
                p.state = PodState.FAILED
    live = [p.name for p in record.pods if p.state not in POD_DONE_STATES and p.node]
    if record.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED):
        return None, live  # a preempted job is requeued by the placer once its last pod is gone
    if record.cancel_requested:
        if not live:
            record.state = JobState.CANCELLED
            record.finished_at = time.time()
            return JobState.CANCELLED, []
        return None, live
    failed = [p for p in record.pods if p.state == PodState.FAILED]
    if failed:
        first = failed[0]
        why = "OOM" if first.reason == ExitReason.OOM.value else f"exited with code {first.exit_code}"
        record.state = JobState.FAILED
        record.reason = f"pod {first.name} {why}" + (f": {exited.message}" if exited.message else "")
        record.finished_at = time.time()
        return JobState.FAILED, live
    if all(p.state == PodState.SUCCEEDED if p.index < gang else p.state in POD_DONE_STATES or p.node is None
           for p in record.pods) and any(p.state == PodState.SUCCEEDED for p in record.pods):
        record.state = JobState.SUCCEEDED
        record.reason = ""
        record.finished_at = time.time()
        return JobState.SUCCEEDED, []
    return None, []


# ---------------------------------------------------------------- fencing
# A pod attempt's fencing token is the job's attempt number (``JobRecord.attempts``, kept in Redis and
# only ever increased by a reservation). Agents know a pod as ``<pod>.a<attempt>``; the decisions below
# say whether a pod an agent reports (or an exit it sends) belongs to the job's current attempt.


def pod_token(record: JobRecord, pod: PodRecord) -> int:
    """A pod's fencing token: the attempt that placed it (elastic extras placed after the job started have
    a newer one than its gang), else the job's attempt."""
    return pod.attempt if pod.attempt is not None else record.attempts


def live_floor(record: JobRecord) -> int:
    """The oldest token among the job's placed pods (its attempt when none is placed)."""
    return min((pod_token(record, p) for p in record.pods if p.node and p.state not in POD_DONE_STATES),
               default=record.attempts)


def holds_attempt(record: JobRecord, attempt: int) -> bool:
    """Is ``attempt`` the job's latest attempt or the token of one of its placed pods?"""
    return record.attempts == attempt or any(p.node and pod_token(record, p) == attempt for p in record.pods)


def extras_attempt(record: JobRecord, attempt: int) -> bool:
    """Did ``attempt`` place only elastic extras of a job already running on its gang (so undoing it
    undoes only those pods)?"""
    gang = record.spec.spec.gang_size
    pods = [p for p in record.pods if p.node and pod_token(record, p) == attempt]
    return record.state == JobState.RUNNING and bool(pods) and all(p.index >= gang for p in pods)


def pod_is_current(record: JobRecord | None, pod: str, attempt: int, node: str) -> bool:
    """True when ``pod`` of attempt ``attempt`` on ``node`` is the live pod the job's record holds.

    Anything else an agent runs is stale: an attempt rolled back or requeued (the token moved on), a pod
    the record already counts as exited, a pod on a node the record does not place it on, or a pod of a
    job that does not exist.
    """
    if record is None:
        return False
    p = next((p for p in record.pods if p.name == pod), None)
    return p is not None and pod_token(record, p) == attempt and p.node == node and p.state not in POD_DONE_STATES


def accepts_exit(record: JobRecord | None, pod: str, attempt: int, node: str) -> bool:
    """An exit counts only for the current token: the job's attempt, the pod's node, a pod not yet done."""
    return pod_is_current(record, pod, attempt, node)


def start_refusal(attempt: int, floor: int, expires_at: float | None, now: float) -> str:
    """Why an agent must not run a start request ('' when it may): an older token than one it has seen
    (``floor``: the lowest attempt of the job that may still start on this node), or a request older
    than its acknowledgement window (the placer has given up on it and rolled the attempt back)."""
    if attempt < floor:
        return f"stale start: attempt {attempt} is older than attempt {floor} seen on this node"
    if expires_at is not None and now > expires_at:
        return f"stale start: the request expired {now - expires_at:.1f}s ago (the placer gave up on it)"
    return ""
