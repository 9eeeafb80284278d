"""Building and publishing job lifecycle events (one place for their subjects and ids)."""

from __future__ import annotations

import asyncio

import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from tide import subjects
from tide.bus.nats import publish
from tide.schemas.events import JobEvent, JobEventDigest, JobRecord, JobState
from tide.subjects import job_event

log = structlog.get_logger()

DIGEST_WINDOW_S = 0.1
"""How long a service gathers its progress events before sending them to metrics as one digest."""
DIGEST_MAX_EVENTS = 500
"""A digest goes at once when it holds this many (a few hundred bytes each: far below NATS' 1 MiB payload)."""


class EventPublisher:
    """Publishes job events on ``tide.events.job.<id>.<kind>`` (JetStream, each acknowledged: what users follow),
    and gathers the progress kinds into one digest for the metrics service (``subjects.EVENT_DIGEST``, core
    NATS) every ``window_s``: one message per digest where a plain subscription per kind cost metrics one
    delivery per event. The terminal kinds are not digested: metrics takes them through its durable consumer
    (the feedback loop acts on them). An event joins the digest only once JetStream has stored it."""

    def __init__(self, js: JetStreamContext, nc: NATS, *, window_s: float = DIGEST_WINDOW_S) -> None:
        self.js, self.nc, self.window_s = js, nc, window_s
        self._pending: list[JobEvent] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def publish(
        self,
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
        """Publish the event ``kind`` of ``record``; its id makes redeliveries de-duplicate (one per job, kind,
        attempt, pod)."""
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
        await publish(self.js, job_event(record.job_id, kind), event)
        if kind in subjects.PROGRESS_EVENT_KINDS:
            self._pending.append(event)
            if len(self._pending) >= DIGEST_MAX_EVENTS:
                self._send()
            elif self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.window_s, self._send)

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        digest, self._pending = JobEventDigest(events=self._pending), []
        task = asyncio.get_running_loop().create_task(self._publish_digest(digest))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _publish_digest(self, digest: JobEventDigest) -> None:
        try:
            await self.nc.publish(subjects.EVENT_DIGEST, digest.to_bytes())
        except Exception as exc:  # noqa: BLE001 - counters missed; the events themselves are in JetStream
            log.warning("event_digest_not_sent", events=len(digest.events), error=repr(exc))

    async def flush(self) -> None:
        """Send what is gathered now (before the connection closes)."""
        self._send()
        if self._sending:
            await asyncio.wait(set(self._sending))
