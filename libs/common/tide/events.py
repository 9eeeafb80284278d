"""Building and publishing job lifecycle events (one place for their subjects and ids)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from tide import subjects
from tide.bus.nats import BATCH_DISABLED, BATCH_MAX, BATCH_UNKNOWN, BatchRefused, FastBatches, publish
from tide.schemas.events import JobEvent, JobEventDigest, JobRecord, JobState
from tide.schemas.feedback import family_of
from tide.subjects import job_event
from tide.tracing import trace_headers

log = structlog.get_logger()

DIGEST_WINDOW_S = 0.1
"""How long a service gathers its progress events before sending them to metrics as one digest."""
DIGEST_MAX_EVENTS = 500
"""A digest goes at once when it holds this many (a few hundred bytes each: far below NATS' 1 MiB payload)."""


BATCH_MIN = 3
"""The fewest events sent as one fast batch: n events cost n + 2 messages that way (the events, the server's flow
acknowledgement of the first, the commit's ack) and 2n one by one, so a batch saves from 3 on. The server's work
per event is the same either way (bench/e2e_latency.py, docs/benchmarks.md)."""


@dataclass
class _Unstored:
    """An event on its way to JetStream, and the future its publisher awaits."""

    subject: str
    event: JobEvent
    headers: dict[str, str]
    stored: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class EventPublisher:
    """Publishes job events on ``tide.events.job.<id>.<kind>`` (JetStream: what users follow), and gathers the
    kinds of ``subjects.DIGEST_EVENT_KINDS`` (progress and success) into one digest for the metrics service
    (``subjects.EVENT_DIGEST``, core NATS) every ``window_s``: one message per digest where a consumer cost
    metrics a delivery (and an ack) per event. Failures, cancellations and rejections are not digested: metrics
    takes them through its durable consumer (``subjects.DURABLE_EVENT_KINDS``). An event joins the digest only
    once JetStream has stored it.

    The events published in one turn of the event loop (a placement cycle's, a batch of submissions', a status
    batch's) go to JetStream as one fast-ingest batch (``tide.bus.nats.FastBatches``) when they are at least
    ``BATCH_MIN``: two acknowledgements for all of them where each cost its own. ``publish`` still returns only
    once its event is stored. An event stored before (a redelivered handler publishing again) is dropped by its id
    in a batch as alone. A batch the server refuses or does not answer is sent again one event at a time, each with
    its id, so the server stores what it lacks and drops the duplicates."""

    def __init__(self, js: JetStreamContext, nc: NATS, *, window_s: float = DIGEST_WINDOW_S) -> None:
        self.js, self.nc, self.window_s = js, nc, window_s
        self._pending: list[JobEvent] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._unstored: list[_Unstored] = []
        self._batches = FastBatches(nc)
        self._batching = True  # off once the server says the stream does not take fast batches

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
            gang=record.spec.spec.gang_size,
            family=family_of(record.spec),
        )
        await self._store(job_event(record.job_id, kind), event)
        if kind in subjects.DIGEST_EVENT_KINDS:
            self._pending.append(event)
            if len(self._pending) >= DIGEST_MAX_EVENTS:
                self._send()
            elif self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.window_s, self._send)

    async def _store(self, subject: str, event: JobEvent) -> None:
        """Hand ``event`` to this turn's batch; return once JetStream stored it."""
        unstored = _Unstored(subject, event, trace_headers({"Nats-Msg-Id": event.event_id}) or {})
        if not self._unstored:
            asyncio.get_running_loop().call_soon(self._send_unstored)
        self._unstored.append(unstored)
        await unstored.stored

    def _send_unstored(self) -> None:
        unstored, self._unstored = self._unstored, []
        for start in range(0, len(unstored), BATCH_MAX):
            self._spawn(self._store_batch(unstored[start:start + BATCH_MAX]))

    async def _store_batch(self, batch: list[_Unstored]) -> None:
        try:
            if len(batch) < BATCH_MIN or not self._batching:
                await self._store_one_by_one(batch)
                return
            try:
                await self._batches.publish([(u.subject, u.event.to_bytes(), u.headers) for u in batch])
            except (BatchRefused, nats.errors.Error) as exc:
                if isinstance(exc, BatchRefused) and exc.err_code in (BATCH_DISABLED, BATCH_UNKNOWN):
                    self._batching = False  # a stream or a server that takes no fast batches: one by one from now
                log.info("event_batch_sent_one_by_one", events=len(batch), reason=repr(exc))
                await self._store_one_by_one(batch)
                return
            for u in batch:
                if not u.stored.done():
                    u.stored.set_result(None)
        except BaseException as exc:  # each publisher hears of it (a cancellation at shutdown goes on up)
            for u in batch:
                if not u.stored.done():
                    u.stored.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def _store_one_by_one(self, batch: list[_Unstored]) -> None:
        results = await asyncio.gather(*[publish(self.js, u.subject, u.event, headers=u.headers) for u in batch],
                                       return_exceptions=True)
        for u, result in zip(batch, results, strict=True):
            if u.stored.done():
                continue
            if isinstance(result, BaseException):
                u.stored.set_exception(result)
            else:
                u.stored.set_result(None)

    def _spawn(self, step: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(step)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        digest, self._pending = JobEventDigest(events=self._pending), []
        self._spawn(self._publish_digest(digest))

    async def _publish_digest(self, digest: JobEventDigest) -> None:
        try:
            await self.nc.publish(subjects.EVENT_DIGEST, digest.to_bytes())
        except Exception as exc:  # noqa: BLE001 - counters missed; the events themselves are in JetStream
            log.warning("event_digest_not_sent", events=len(digest.events), error=repr(exc))

    async def flush(self) -> None:
        """Send what is gathered now (before the connection closes)."""
        self._send_unstored()
        self._send()
        if self._sending:
            await asyncio.wait(set(self._sending))
