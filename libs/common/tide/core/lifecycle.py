"""The job and pod state machine: pure transitions of a JobRecord (the clock is passed in as ``now``).

Every transition changes the record it is given in place and returns whether it applied; a refused
transition (the record moved on: another attempt, a cancel, a terminal state) leaves it unchanged. The
placer only applies these inside its atomic record updates; see docs/architecture.md for the table.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence

from tide.core.job_placement import pod_name
from tide.schemas.events import (
    POD_DONE_STATES,
    TERMINAL_STATES,
    ExitReason,
    GpuAssignment,
    JobRecord,
    JobState,
    PodExited,
    PodFate,
    PodRecord,
    PodStarted,
    PodState,
)
from tide.schemas.job import JobSpec

PLACEABLE = (JobState.PENDING, JobState.UNSCHEDULABLE)


def mark_pod_started(record: JobRecord, pod: str, now: float | None = None) -> bool:
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
        record.started_at = time.time() if now is None else now
        return True
    return False


def reset_pod(p: PodRecord) -> None:
    """The pod wants placement again (a requeue, a rollback, a stopped or lost elastic extra)."""
    p.node, p.gpus, p.state, p.exit_code, p.reason, p.stopping, p.attempt = None, [], PodState.PENDING, None, None, \
        False, None


def mark_pod_exited(record: JobRecord, exited: PodExited, now: float | None = None
                    ) -> tuple[JobState | None, list[str]]:
    """Record a pod's exit. Returns (the job's new terminal state or None, pods still to stop).

    Elastic jobs: an extra pod (index >= minMember) stopped while its job runs (a pod-level preemption)
    wants placement again; the job succeeds when its minMember pods succeeded and every other pod that
    ran exited 0 (a stopped extra is not a failure)."""
    now = time.time() if now is None else now
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
            record.finished_at = now
            return JobState.CANCELLED, []
        return None, live
    failed = [p for p in record.pods if p.state == PodState.FAILED]
    if failed:
        first = failed[0]
        why = "OOM" if first.reason == ExitReason.OOM.value else f"exited with code {first.exit_code}"
        record.state = JobState.FAILED
        record.reason = f"pod {first.name} {why}" + (f": {exited.message}" if exited.message else "")
        record.finished_at = now
        return JobState.FAILED, live
    if all(p.state == PodState.SUCCEEDED if p.index < gang else p.state in POD_DONE_STATES or p.node is None
           for p in record.pods) and any(p.state == PodState.SUCCEEDED for p in record.pods):
        record.state = JobState.SUCCEEDED
        record.reason = ""
        record.finished_at = now
        return JobState.SUCCEEDED, []
    return None, []


# ---------------------------------------------------------------- job transitions
# Each takes the record as read (and ``now``) and applies only when the record is still where the
# caller saw it; the placer retries them on a fresh copy when the record changed under it.


def nominate(record: JobRecord, reason: str, now: float) -> bool:
    """The job started preempting victims to fit: the wait for them is timed from ``now``."""
    record.nominated_at, record.reason = now, reason
    return True


def mark_unplaced(record: JobRecord, state: JobState, reason: str) -> bool:
    """A cycle could not place a waiting job: it stays pending (it may fit later) or turns unschedulable.
    Refused once the job is reserved, cancelled, or no longer waiting."""
    if record.state not in PLACEABLE or record.cancel_requested or record.reservation:
        return False
    record.state, record.reason = state, reason
    return True


def gang_timed_out(record: JobRecord, seen: JobSpec, action: str, shrunk: JobSpec | None, reason: str,
                   now: float) -> bool:
    """A waiting gang past its gangTimeoutSeconds: ``action`` "fail" fails it, else its spec becomes
    ``shrunk`` (minMember 1). Refused when the job is reserved, cancelled, no longer waiting, or its spec
    is not the one the timeout was judged on (``seen``)."""
    if record.state not in PLACEABLE or record.cancel_requested or record.reservation or record.spec != seen:
        return False
    if action == "fail":
        record.state, record.finished_at = JobState.FAILED, now
    elif shrunk is not None:
        record.spec = shrunk
    record.reason = reason
    return True


def preempt(record: JobRecord, by: str, why: str) -> bool:
    """Preempt a running job (its pods are then stopped gracefully); refused unless it runs."""
    if record.state != JobState.RUNNING:
        return False
    record.state, record.reason, record.preempted_by = JobState.PREEMPTED, f"preempted by {by} ({why})", by
    record.preemptions += 1
    return True


def preempt_extras(record: JobRecord, indices: Collection[int], by: str, why: str) -> list[tuple[str, str, int]]:
    """Mark elastic extra pods (index >= minMember) of a running job stopping (pod-level preemption).
    Returns (pod, node, token) of each pod to stop; empty: refused (the job does not run, is being
    cancelled, or none of those pods is placed, live and not already stopping)."""
    if record.state != JobState.RUNNING or record.cancel_requested:
        return []
    chosen = []
    for p in record.pods:
        if (p.index in indices and p.index >= record.spec.spec.gang_size and p.node and not p.stopping
                and p.state not in POD_DONE_STATES):
            p.stopping, p.reason = True, f"preempted by {by} ({why})"
            chosen.append((p.name, p.node, pod_token(record, p)))
    return chosen


def requeue_preempted(record: JobRecord, now: float) -> bool:
    """A preempted job whose last pod is gone waits for placement again; refused while a pod still runs."""
    if record.state != JobState.PREEMPTED or any(p.node and p.state not in POD_DONE_STATES for p in record.pods):
        return False
    record.state, record.reason = JobState.PENDING, f"requeued after preemption by {record.preempted_by}"
    record.queued_at = now
    for p in record.pods:
        reset_pod(p)
    return True


def _place(record: JobRecord, attempt: int, pods: Mapping[int, tuple[str, list[str]]]) -> None:
    have = {p.index for p in record.pods}
    record.pods.extend(PodRecord(name=pod_name(record.job_id, i), index=i) for i in sorted(set(pods) - have))
    record.pods.sort(key=lambda p: p.index)
    by_index = {p.index: p for p in record.pods}
    for index, (node, gpus) in pods.items():
        pod = by_index[index]
        pod.node, pod.state, pod.attempt, pod.stopping = node, PodState.STARTING, attempt, False
        pod.gpus = list(gpus)
        pod.exit_code = pod.reason = None


def reserve(record: JobRecord, attempt: int, resv: str, pods: Mapping[int, tuple[str, list[str]]],
            spec: JobSpec) -> bool:
    """Record attempt ``attempt`` (the next fencing token) of a waiting job under reservation ``resv``:
    ``pods`` maps pod index to (node, GPU UUIDs); ``spec`` is the spec it was placed with (a gang its
    timeout shrank). Refused when the job is cancelled, another attempt got there first, it no longer
    waits, or its gang spec changed meanwhile."""
    if record.cancel_requested or record.attempts != attempt - 1:
        return False
    if record.state not in PLACEABLE or (record.spec != spec and record.spec.spec.gang_size > 1):
        return False
    record.spec = spec
    record.state, record.reason, record.attempts, record.reservation = JobState.PENDING, "starting", attempt, resv
    record.nominated_at = None
    _place(record, attempt, pods)
    return True


def reserve_extras(record: JobRecord, attempt: int, resv: str, pods: Mapping[int, tuple[str, list[str]]]) -> bool:
    """Record attempt ``attempt`` placing only elastic extras of a job running on its gang; its running
    pods keep their own token. Refused when the job is cancelled, another attempt got there first, it
    does not run, has an open reservation, or one of those pods is placed already."""
    if record.cancel_requested or record.attempts != attempt - 1:
        return False
    placed = {p.index: p for p in record.pods}
    if record.state != JobState.RUNNING or record.reservation or any(
            i in placed and placed[i].node for i in pods):
        return False
    for pod in record.pods:  # the running pods keep their token
        if pod.node and pod.attempt is None:
            pod.attempt = record.attempts
    record.attempts, record.reservation = attempt, resv
    _place(record, attempt, pods)
    return True


def commit(record: JobRecord, resv: str) -> bool:
    """Every pod of reservation ``resv`` started: it is committed (False: the record moved on)."""
    if record.reservation != resv:
        return False
    record.reservation, record.avoid_nodes = None, []
    return True


def adoptable(record: JobRecord, resv: str, attempt: int) -> bool:
    """A reservation another placer left can be committed by the leader: the record still names it, the job
    is running, and every pod of that attempt has started (a short one may already have ended: rolling it
    back would run it again)."""
    if record.reservation != resv or record.state != JobState.RUNNING or record.cancel_requested:
        return False
    pods = [p for p in record.pods if p.node and pod_token(record, p) == attempt]
    return bool(pods) and all(p.state == PodState.RUNNING or p.state in POD_DONE_STATES for p in pods)


def can_roll_back(record: JobRecord | None, attempt: int) -> bool:
    """Can ``attempt`` still be undone: the job exists, holds that attempt and has not ended?"""
    return record is not None and holds_attempt(record, attempt) and record.state not in TERMINAL_STATES


def rollback(record: JobRecord, attempt: int, why: str, avoid: Collection[str], backoff_s: float,
             now: float) -> bool:
    """Undo attempt ``attempt`` whole: the job waits again, not before ``now + backoff_s``, avoiding the
    nodes ``avoid``; every pod wants placement again. Refused for an attempt the job no longer holds (an
    older one) and for a job that ended."""
    if not can_roll_back(record, attempt):
        return False
    record.state, record.reason, record.reservation = JobState.PENDING, f"requeued: {why}", None
    record.not_before = now + backoff_s
    record.queued_at = now
    record.avoid_nodes = sorted(set(record.avoid_nodes) | set(avoid))
    for p in record.pods:
        reset_pod(p)
    return True


def rollback_extras(record: JobRecord, attempt: int, resv: str, avoid: Collection[str]) -> bool:
    """Undo an attempt that placed only elastic extras (``resv``: its reservation): those pods want
    placement again, the job keeps running on its gang. Refused unless ``attempt`` is such an attempt."""
    if not extras_attempt(record, attempt):
        return False
    if record.reservation == resv:
        record.reservation = None
    record.avoid_nodes = sorted(set(record.avoid_nodes) | set(avoid))
    for p in record.pods:
        if p.node and pod_token(record, p) == attempt:
            reset_pod(p)
    return True


def request_cancel(record: JobRecord, reason: str, now: float) -> bool:
    """A user cancels the job: a waiting job with no placed pod is cancelled at once, any other is marked
    (its pods are stopped, then ``finish_cancel``). Refused for a job that ended or is already cancelling."""
    if record.state in TERMINAL_STATES or record.cancel_requested:
        return False
    record.cancel_requested = True
    record.reason = reason
    if record.state in PLACEABLE and not any(p.node for p in record.pods):
        record.state = JobState.CANCELLED
        record.finished_at = now
    return True


def finish_cancel(record: JobRecord, now: float) -> bool:
    """The job is cancelled (its pods are gone); refused for a job that ended."""
    if record.state in TERMINAL_STATES:
        return False
    record.state, record.finished_at = JobState.CANCELLED, now
    return True


def pod_started(record: JobRecord, pod: str, attempt: int, node: str, now: float) -> bool | None:
    """A pod of attempt ``attempt`` reports it started on ``node``. None: refused (not that pod's token or
    node: an attempt that is over, whose pod must be stopped); else whether the job turned running."""
    if not accepts_start(record, pod, attempt, node):
        return None
    return mark_pod_started(record, pod, now)


def pod_exited(record: JobRecord, exited: PodExited, attempt: int, now: float
               ) -> tuple[JobState | None, list[str]] | None:
    """A pod (``exited.pod``: its name) of attempt ``attempt`` exited. None: refused (not the current
    token: see ``accepts_exit``); else ``mark_pod_exited``'s outcome. A checkpointed exit records it."""
    if not accepts_exit(record, exited.pod, attempt, exited.node_id):
        return None
    if exited.checkpointed:
        record.last_checkpoint_at = exited.ts
    return mark_pod_exited(record, exited, now)


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


def accepts_start(record: JobRecord, pod: str, attempt: int, node: str) -> bool:
    """A pod-started counts for the pod's current token on the node the record places it on (the pod may
    have exited already: a short pod)."""
    p = next((p for p in record.pods if p.name == pod), None)
    return p is not None and pod_token(record, p) == attempt and p.node == node


def accepts_exit(record: JobRecord | None, pod: str, attempt: int, node: str) -> bool:
    """An exit counts only for the current token: the job's attempt, the pod's node, a pod not yet done."""
    return pod_is_current(record, pod, attempt, node)


def pod_fate(key: str, running: Collection[str], exited: Collection[str]) -> PodFate:
    """An agent's answer to ``SettlePod`` for the pod it knows as ``key`` (``<job>/<pod>.a<attempt>``): running,
    exited (one of its recent exits), or absent. The agent answers only after every command sent before the
    question was handled (one command at a time, in order), and raises its floor past an absent pod's attempt,
    so ``absent`` stays true."""
    if key in running:
        return PodFate.RUNNING
    if key in exited:
        return PodFate.EXITED
    return PodFate.ABSENT


def start_refusal(attempt: int, floor: int, expires_at: float | None, now: float) -> str:
    """Why an agent must not run a start request ('' when it may): an older token than one it has seen
    (``floor``: the lowest attempt of the job that may still start on this node), or a request older
    than its acknowledgement window (the placer has given up on it and rolled the attempt back)."""
    if attempt < floor:
        return f"stale start: attempt {attempt} is older than attempt {floor} seen on this node"
    if expires_at is not None and now > expires_at:
        return f"stale start: the request expired {now - expires_at:.1f}s ago (the placer gave up on it)"
    return ""


def transition_key(transition: PodStarted | PodExited) -> str:
    """The agent's key of the pod a transition is about (``<job>/<pod>.a<attempt>``)."""
    return f"{transition.job_id}/{transition.pod}"


def transitions_to_report(items: list[PodStarted | PodExited], answered: set[str]) -> list[PodStarted | PodExited]:
    """The transitions a status batch carries: all but the ``PodStarted`` of pods whose start was answered
    ``started`` (``answered``) and that have not exited since (an exit in the same batch keeps its start
    before it, so the placer never sees a pod end before it began)."""
    exited = {transition_key(t) for t in items if isinstance(t, PodExited)}
    return [t for t in items
            if not (isinstance(t, PodStarted) and transition_key(t) in answered and transition_key(t) not in exited)]


def gpus_overcommitted(
    wanted: Sequence[GpuAssignment], held: Mapping[str, Sequence[GpuAssignment]],
) -> dict[str, list[int]]:
    """The pods (by key) that hold a share of a GPU the new pod wants, where both together would pass the
    whole GPU (1000 milli), and which GPU indexes. MIG slices are left to the MIG table (their instances
    never overlap). A start must not run beside such a pod: its claims were released while it still ran
    (a stop acknowledged before the process died), or Redis and the node disagree."""
    want = {g.index: g.milli for g in wanted if g.mig_profile is None}
    used: dict[int, int] = {}
    for gpus in held.values():
        for g in gpus:
            if g.mig_profile is None and g.index in want:
                used[g.index] = used.get(g.index, 0) + g.milli
    full = {i for i, milli in want.items() if used.get(i, 0) + milli > 1000}
    clashes: dict[str, list[int]] = {}
    for key, gpus in held.items():
        hit = sorted({g.index for g in gpus if g.mig_profile is None and g.index in full})
        if hit:
            clashes[key] = hit
    return clashes
