"""`tide describe JOB`: the spec, the state, and every event of the job's life with reason codes.

The services carry human text only; ``reason_code`` derives a structured code from an event's kind,
state and text (Kubernetes-style ``Reason/Detail``), in one pure function, so scripts can match on
codes while the text stays free to change wording.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from tide.bus.dead_letters import DeadLetter
from tide.schemas.events import JobEvent

# (pattern in the reason text, code): first match wins
_WAITING: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"gang timeout"), "GangTimeout"),
    (re.compile(r"at its limit:"), "QuotaExceeded"),
    (re.compile(r"not preemptible, so it may not borrow"), "QuotaExceeded/BeyondGuarantee"),
    (re.compile(r"kept unlent by other queues' lendingLimit"), "QuotaExceeded/LendingLimit"),
    (re.compile(r"pods of the gang fit now; waiting|^needs \d+ pods"), "WaitingForGang"),
    (re.compile(r"^preempting "), "Nominated/Preempting"),
    (re.compile(r"^consolidating"), "Nominated/Consolidating"),
    (re.compile(r"no node matches selector|fail selector"), "Unschedulable/NodeSelectorMismatch"),
    (re.compile(r"MIG"), "Unschedulable/InsufficientMIG"),
    (re.compile(r"no GPU.* has \d+ MiB of memory|GPU memory"), "Unschedulable/InsufficientGPUMemory"),
    (re.compile(r"no node.* has GPUs|have no GPU"), "Unschedulable/NoMatchingGPU"),
    (re.compile(r"GPU|can never fit|whole cluster holds"), "Unschedulable/InsufficientGPU"),
    (re.compile(r"m CPU requested|CPU free"), "Unschedulable/InsufficientCPU"),
    (re.compile(r"MiB memory requested|memory free"), "Unschedulable/InsufficientMemory"),
    (re.compile(r"^0/\d+ nodes fit"), "Unschedulable"),
]
_REQUEUED: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"preemption|preempted"), "Requeued/Preempted"),
    (re.compile(r"lost"), "Requeued/NodeLost"),
    (re.compile(r"start|refused|failed"), "Requeued/StartFailed"),
    (re.compile(r"reserv|claim"), "Requeued/ReservationLost"),
]
_SIMPLE = {
    "queued": "Queued", "placed": "Reserved", "running": "Running", "succeeded": "Succeeded",
    "cancelled": "Cancelled", "checkpoint": "CheckpointRequested", "preempted": "Preempted",
    "pod-preempted": "Preempted/ElasticExtra", "extras-placed": "Reserved/ElasticExtras",
    "extras-requeued": "Requeued/ElasticExtras", "shrunk": "GangTimeout/Shrunk", "pod-started": "PodStarted",
    "rejected": "Rejected/InvalidSpec",
}


def waiting_code(reason: str) -> str:
    """The code of a pending or unschedulable job's reason text."""
    for pattern, code in _WAITING:
        if pattern.search(reason):
            return code
    return "Pending"


def reason_code(kind: str, state: str, reason: str) -> str:
    """A structured code for one event (``kind`` as in ``tide.events.job.<id>.<kind>``) or, with
    ``kind=""``, for a job's current state and reason."""
    if kind == "pod-exited":
        return f"PodExited/{reason or 'Unknown'}"  # the agent's exit reason: Completed, Error, OOM, Lost...
    if kind == "requeued" or (not kind and reason.startswith("requeued")):
        return next((code for p, code in _REQUEUED if p.search(reason)), "Requeued")
    if kind == "failed" or (not kind and state == "failed"):
        if "gang timeout" in reason:
            return "Failed/GangTimeout"
        if re.search(r"\bOOM\b", reason):
            return "Failed/OOM"
        if "StartFailed" in reason or "start" in reason:
            return "Failed/StartFailed"
        return "Failed/Error"
    if kind == "unschedulable" or (not kind and state in ("pending", "unschedulable")):
        code = waiting_code(reason)
        return "Unschedulable" if code == "Pending" and state == "unschedulable" else code
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if not kind:
        return {"preempted": "Preempted", "rejected": "Rejected/InvalidSpec"}.get(state, state.capitalize())
    return kind.title().replace("-", "")


_RESUBMISSION = re.compile(r"^(?P<root>.+)-r(?P<k>[0-9]+)$")


def related_ids(job_id: str) -> dict[str, str]:
    """The ids a feedback-loop resubmission chain may link to this job (``a`` -> ``a-r1`` -> ``a-r2``, as
    ``tide.core.feedback.resubmit_id`` names them): ``resubmitted_as`` and, for a resubmission,
    ``resubmission_of``. Candidates only: the caller checks that they exist."""
    from tide.core.feedback import resubmit_id

    related = {"resubmitted_as": resubmit_id(job_id)[0]}
    m = _RESUBMISSION.match(job_id)
    if m:
        k = int(m["k"])
        related["resubmission_of"] = m["root"] if k == 1 else f"{m['root']}-r{k - 1}"
    return related


@dataclass(frozen=True)
class Row:
    ts: float
    code: str
    text: str


def event_attempt(e: JobEvent) -> int | None:
    """The job attempt an event belongs to, from its id (``<job>.<kind>.<attempt>.<pod>``, see
    ``tide.events.EventPublisher.publish``); None for ids of another shape."""
    parts = e.event_id.split(".")
    if len(parts) >= 3 and parts[0] == e.job_id and parts[1] == e.kind and parts[2].isdigit():
        return int(parts[2])
    return None


def event_text(e: JobEvent) -> str:
    """One line of human text for an event."""
    attempt = event_attempt(e) if e.kind in ("placed", "pod-started", "pod-exited") else None
    pod = f"pod {e.pod}" + (f" (attempt {attempt})" if attempt else "") if e.pod else ""
    where = " ".join(x for x in (pod, f"on {e.node}" if e.node else "") if x)
    if e.kind == "pod-exited":
        code = f" (exit code {e.exit_code})" if e.exit_code is not None else ""
        return f"{where}: {e.reason}{code}".strip()
    if e.kind == "queued":
        text = f"queued in {e.queue or 'default'} ({e.priority_class or '-'})"
        return f"{text}: {e.reason}" if e.reason else text
    if e.kind == "placed" and e.wait_s is not None:
        return f"reserved {e.wait_s:.1f}s after submission" + (f" (attempt {attempt})" if attempt else "")
    return ": ".join(p for p in (where, e.reason) if p)


def timeline(events: list[JobEvent], record: dict[str, Any] | None, links: dict[str, str]) -> list[Row]:
    """The job's life: its events (with codes), the nomination the record holds (not an event), and the
    resubmissions linked to it."""
    rows = [Row(e.ts, reason_code(e.kind, e.state.value, e.reason), ": ".join(t for t in (e.kind, event_text(e)) if t))
            for e in events]
    last = max((r.ts for r in rows), default=0.0)
    if record and record.get("nominated_at") and record.get("state") == "pending":
        reason = record.get("reason", "")
        rows.append(Row(record["nominated_at"], waiting_code(reason) if reason else "Nominated",
                        f"nominated: {reason or 'evicting victims to fit'}"))
    if "resubmission_of" in links and record:
        rows.append(Row(record.get("submitted_at", 0.0), "Resubmitted", f"resubmission of {links['resubmission_of']}"))
    if "resubmitted_as" in links:  # the feedback loop resubmits once the job has failed: after its last event
        rows.append(Row(last, "Resubmitted", f"resubmitted as {links['resubmitted_as']}"))
    rows.sort(key=lambda r: r.ts)  # stable: the resubmission stays after the failure it follows
    return rows


def compact(value: Any) -> Any:
    """The spec without its unset (null) and empty fields, as a user would have written it."""
    if isinstance(value, dict):
        kept = {k: compact(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != {} and v != []}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return value


def fmt_ts(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def render(record: dict[str, Any], rows: list[Row], links: dict[str, str], spec_yaml: str,
           letters: list[DeadLetter] | None = None) -> str:
    meta = record["spec"]["metadata"] if "spec" in record else {}
    lines = [
        f"Job:        {record['job_id']}",
        f"State:      {record['state']}",
        f"Reason:     {reason_code('', record['state'], record.get('reason', ''))}"
        + (f"  {record['reason']}" if record.get("reason") else ""),
        f"Queue:      {meta.get('queue', 'default')}   Priority: {meta.get('priorityClass', 'offline-training')}",
    ]
    for key, label in (("submitted_at", "Submitted"), ("started_at", "Started"), ("finished_at", "Finished")):
        if record.get(key):
            lines.append(f"{label + ':':<12}{fmt_ts(record[key])}")
    if record.get("attempts") is not None:
        lines.append(f"Attempts:   {record.get('attempts', 0)}   Preemptions: {record.get('preemptions', 0)}"
                     + (f" (last by {record['preempted_by']})" if record.get("preempted_by") else ""))
    if "resubmission_of" in links:
        lines.append(f"Resubmission of: {links['resubmission_of']}")
    if "resubmitted_as" in links:
        lines.append(f"Resubmitted as:  {links['resubmitted_as']}")
    pods = record.get("pods", [])
    if pods:
        lines.append("Pods:")
        lines.append(f"  {'NAME':<32} {'STATE':<11} {'NODE':<16} {'EXIT':>4}  GPUS")
        for p in pods:
            exit_code = "-" if p.get("exit_code") is None else str(p["exit_code"])
            lines.append(f"  {p['name']:<32} {p['state']:<11} {p.get('node') or '-':<16} {exit_code:>4}  "
                         f"{','.join(p.get('gpus', [])) or '-'}")
    if spec_yaml:
        lines.append("Spec:")
        lines += ["  " + line for line in spec_yaml.rstrip().splitlines()]
    lines.append("Events:")
    if not rows:
        lines.append("  (none kept in the EVENTS stream)")
    width = max((len(r.code) for r in rows), default=0)
    for r in rows:
        lines.append(f"  {fmt_ts(r.ts)}  {r.code:<{width}}  {r.text}")
    if letters:
        lines += dead_letter_lines(letters)
    return "\n".join(lines)


def dead_letter_lines(letters: list[DeadLetter]) -> list[str]:
    """Messages about the job that a service's handler gave up on (the DLQ stream), with the reason."""
    lines = ["Dead letters:"]
    for d in letters:
        lines.append(f"  {fmt_ts(d.ts)}  consumer {d.consumer}  subject {d.subject}  after {d.deliveries} deliveries")
        lines.append(f"    reason: {d.error or '-'}")
    return lines


def dead_letter_dicts(letters: list[DeadLetter]) -> list[dict[str, Any]]:
    return [{"ts": d.ts, "consumer": d.consumer, "subject": d.subject, "reason": d.error,
             "deliveries": d.deliveries} for d in letters]
