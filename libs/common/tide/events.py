"""Building and publishing job lifecycle events (one place for their subjects and ids)."""

from __future__ import annotations

from nats.js import JetStreamContext

from tide.bus.nats import publish
from tide.schemas.events import JobEvent, JobRecord, JobState
from tide.subjects import job_event


async def publish_job_event(
    js: JetStreamContext,
    record: JobRecord,
    kind: str,
    *,
    reason: str | None = None,
    pod: str | None = None,
    node: str | None = None,
    exit_code: int | None = None,
    wait_s: float | None = None,
    state: JobState | None = None,
) -> None:
    """Publish ``tide.events.job.<id>.<kind>``; the event id makes redeliveries de-duplicate."""
    event = JobEvent(
        event_id=f"{record.job_id}.{kind}.{record.attempts}.{pod or ''}",
        job_id=record.job_id,
        kind=kind,
        state=state or record.state,
        reason=record.reason if reason is None else reason,
        pod=pod,
        node=node,
        exit_code=exit_code,
        queue=record.spec.metadata.queue,
        priority_class=record.spec.metadata.priority_class.value,
        wait_s=wait_s,
    )
    await publish(js, job_event(record.job_id, kind), event)
