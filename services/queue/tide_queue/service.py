"""The queue service: job intake and validation, the pending queue, cancellation, status API."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import nats.errors
import nats.js.errors
import structlog
import yaml
from nats.aio.msg import Msg
from nats.js.api import RawStreamMsg
from opentelemetry import trace
from tide import subjects
from tide.batch import Batcher
from tide.bus.dead_letters import DeadLetter, is_job_token
from tide.bus.nats import close_nats, connect, consume, ensure_streams, publish
from tide.core.job_placement import job_demand
from tide.core.lifecycle import request_cancel
from tide.core.queue_order import pending_score
from tide.core.queues import QueueTree
from tide.core.tides import parse_tides
from tide.events import EventPublisher
from tide.schemas.events import (
    JOB_ID_PATTERN,
    CancelJob,
    JobEvent,
    JobRecord,
    JobRejected,
    JobState,
    PodRecord,
    SubmitJob,
)
from tide.schemas.node import NODE_ID_PATTERN
from tide.settings import Settings
from tide.stack.auth import Tenant, load_tenants, service_inbox_prefix
from tide.store import keys
from tide.store.jobs import JobStore
from tide.store.redis import redis_for
from tide.tracing import current_traceparent, job_span

from tide_queue.validation import check_tenant, parse_submission

log = structlog.get_logger()
tracer = trace.get_tracer("tide.queue")
REJECTION_TTL_S = 24 * 3600
HISTORY_MAX_EVENTS = 2000  # a tenant's `tide describe`: at most this many events of one job
HISTORY_MAX_BYTES = 512 * 1024  # and this many bytes of them (the reply stays under NATS's max_payload)
LOGS_TIMEOUT_S = 3.0  # a forwarded logs request waits this long for the node (the client may ask for up to 10 s)
_JOB_ID = re.compile(JOB_ID_PATTERN)
_NODE_ID = re.compile(NODE_ID_PATTERN)


PENDING_COUNT_FRESH_S = 1.0
"""How long the pending set's size as a creation returned it stands for the limits' first check (below every limit:
no count per queue or tenant needed). The placer only takes jobs out, so the count is at most too high (the exact
check then runs); another queue replica's submissions of that last second are what it can miss, as two concurrent
submissions could each miss the other's anyway: the limits are a bound on a backlog, not an exact count."""


class Kicker:
    """Kicks of the placer (core NATS, ``subjects.PLACER_KICK``) after a cancel or a new queue config (a new job's
    kick is its ``queued`` event, which the placer follows), coalesced: a kick when none went out in the last
    ``window_s`` goes at once; those asked for within the window become one kick at its end, so cancellations
    closer together than the window (a burst) share kicks, one per window instead of one each
    (``TIDE_QUEUE_KICK_WINDOW_S``: a cancel waits at most that long for its kick). A kick is only a hint (the
    placer also plans every ``placer_tick_s``): one lost with a crashing queue delays the stop by a tick."""

    def __init__(self, send: Callable[[], Awaitable[None]], window_s: float) -> None:
        self.send = send
        self.window_s = window_s
        self.sent = 0
        self._wanted = False
        self._task: asyncio.Task[None] | None = None

    def kick(self) -> None:
        if self._task is not None:
            self._wanted = True  # the running window sends it at its end
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                self._wanted = False
                try:
                    await self.send()
                    self.sent += 1
                except Exception as exc:  # noqa: BLE001 - NATS away: the placer's tick plans anyway
                    log.warning("placer_kick_failed", error=repr(exc))
                await asyncio.sleep(self.window_s)
                if not self._wanted:
                    return
        finally:
            self._task = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


class QueueService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tenants: dict[str, Tenant] = {}
        self._tenants_mtime: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.kicker = Kicker(self._send_kick, settings.queue_kick_window_s)
        self._pending_seen = (0, -PENDING_COUNT_FRESH_S)  # the pending set's size as last seen, and when (monotonic)

    async def _send_kick(self) -> None:
        await self.nc.publish(subjects.PLACER_KICK, b"kick")

    def tenants(self) -> dict[str, Tenant]:
        """The tenants' policies, re-read whenever ``tide user add`` rewrote the file."""
        path = self.settings.tenants_file
        if path is None:
            return {}
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        if mtime != self._tenants_mtime:
            self._tenants, self._tenants_mtime = load_tenants(path), mtime
        return self._tenants

    async def start(self) -> None:
        self.nc = await connect(self.settings, "tide-queue", inbox_prefix=service_inbox_prefix("queue"))
        self.js = self.nc.jetstream()
        self.events = EventPublisher(self.js, self.nc)
        await ensure_streams(self.js)
        self.redis = redis_for(self.settings)
        self.jobs = JobStore(self.redis)
        # the submissions of a fetched batch are handled concurrently: their Redis steps go together
        self._creates: Batcher[tuple[JobRecord, float], int] = Batcher(self.jobs.create_many)
        self._pending_counts: Batcher[None, int] = Batcher(self._count_pending)
        await self.nc.subscribe(subjects.API_STATUS, cb=self._api_status)
        await self.nc.subscribe(subjects.API_STATUS_TENANTS, cb=self._api_status)
        # each in a task of its own: a node that does not answer must not hold up other tenants' requests
        await self.nc.subscribe(subjects.API_HISTORY_TENANTS, cb=self._on_history)
        await self.nc.subscribe(subjects.API_LOGS_TENANTS, cb=self._on_logs)
        await self.nc.subscribe(subjects.API_QUEUES, cb=self._api_queues)
        await self.nc.subscribe(subjects.API_QUEUES_APPLY, cb=self._api_queues_apply)
        if self.settings.queue_config is not None:
            config = yaml.safe_load(self.settings.queue_config.read_text())
            await self.apply_queue_config(config)

    async def run(self, stop: asyncio.Event) -> None:
        linger_s, above = self.settings.queue_intake_linger_s, self.settings.queue_intake_linger_above_per_s
        await consume(self.js, subjects.QUEUE_INTAKE, self._on_intake, stop, order_key=intake_order_key,
                      linger_s=linger_s, linger_above_per_s=above)

    async def close(self) -> None:
        await self.kicker.close()
        for task in list(self._tasks):
            task.cancel()
        await self.events.flush()
        await close_nats(self.nc)
        await self.redis.aclose()

    # ------------------------------------------------------------ intake
    async def _on_intake(self, msg: Msg) -> None:
        owner = subjects.tenant_of(msg.subject)  # the tenant whose subject it came on; None: the admin
        if msg.subject == subjects.JOB_SUBMIT or msg.subject.startswith(subjects.JOB_SUBMIT + "."):
            await self._on_submit(msg, owner)
        elif msg.subject == subjects.JOB_CANCEL or msg.subject.startswith(subjects.JOB_CANCEL + "."):
            await self._on_cancel(msg, owner)
        await msg.ack()

    async def _on_submit(self, msg: Msg, owner: str | None = None) -> None:
        hint = (msg.headers or {}).get("Tide-Job-Id")
        parsed = parse_submission(msg.data, self.settings.max_payload_bytes, hint)
        with job_span(tracer, "queue.submit", parsed.job_id or hint):
            if isinstance(parsed, SubmitJob) and owner is not None:
                parsed = check_tenant(parsed, owner, self.tenants().get(owner))
            if isinstance(parsed, SubmitJob):
                parsed = await self._check_limits(parsed, owner)
            if isinstance(parsed, JobRejected):
                await self._reject(parsed, owner)
                return
            await self._accept(parsed, owner)

    async def _check_limits(self, sub: SubmitJob, owner: str | None) -> SubmitJob | JobRejected:
        """At most ``max_pending_per_queue`` pending jobs in a queue and ``max_pending_per_tenant`` (or the
        tenant's own ``max_pending``) of one tenant. Counted only when the pending set is that long at all."""
        queue_limit = self.settings.max_pending_per_queue
        tenant = self.tenants().get(owner) if owner else None
        tenant_limit = (tenant.max_pending if tenant and tenant.max_pending is not None
                        else self.settings.max_pending_per_tenant)
        limits = [queue_limit] + ([tenant_limit] if owner else [])
        if await self._pending_count() < min(limits):
            return sub
        job_id = sub.job_id
        records = [r for r in await self.jobs.get_many(await self.jobs.pending(10 * max(limits)))
                   if r is not None and r.job_id != job_id]
        queue = sub.spec.metadata.queue
        if sum(1 for r in records if r.spec.metadata.queue == queue) >= queue_limit:
            return JobRejected(job_id=job_id, field="metadata.queue",
                               reason=f"queue {queue!r} has {queue_limit} pending jobs, its limit "
                                      "(TIDE_MAX_PENDING_PER_QUEUE); retry later")
        if owner and sum(1 for r in records if r.owner == owner) >= tenant_limit:
            return JobRejected(job_id=job_id, field="tenant",
                               reason=f"tenant {owner!r} has {tenant_limit} pending jobs, its limit; retry later")
        return sub

    async def _create(self, record: JobRecord, score: float) -> bool:
        """Store and enqueue a new job, with the other submissions of this turn (one round trip), keeping the
        pending set's size it answers with; False when the id existed."""
        pending = await self._creates((record, score))
        if pending:
            self._pending_seen = (pending, time.monotonic())
        return bool(pending)

    async def _pending_count(self) -> int:
        """The pending set's size: as this queue's last creation (or read) saw it, within
        ``PENDING_COUNT_FRESH_S``; else read, once for every submission that asks in the same turn."""
        size, seen_at = self._pending_seen
        if time.monotonic() - seen_at < PENDING_COUNT_FRESH_S:
            return size
        return await self._pending_counts(None)

    async def _count_pending(self, asking: list[None]) -> list[int]:
        size = await self.redis.zcard(keys.PENDING)
        self._pending_seen = (size, time.monotonic())
        return [size] * len(asking)

    async def _reject(self, rejection: JobRejected, owner: str | None = None) -> None:
        log.info("job_rejected", job_id=rejection.job_id, field=rejection.field, reason=rejection.reason,
                 tenant=owner)
        await publish(self.js, subjects.JOB_REJECTED, rejection)
        if rejection.job_id:
            existing = await self.jobs.get(rejection.job_id)
            if existing is not None and existing.owner != owner and owner is not None:
                # a tenant used someone else's job id: that job's status and events stay untouched; the
                # verdict is kept where only this tenant's status requests look
                await self.redis.set(keys.rejected(f"{rejection.job_id}.{owner}"),
                                     json.dumps({"field": rejection.field, "reason": rejection.reason}), ex=60)
                return
            await self.redis.set(
                keys.rejected(rejection.job_id),
                json.dumps({"field": rejection.field, "reason": rejection.reason, "owner": owner}),
                ex=REJECTION_TTL_S,
            )
            event = JobEvent(
                event_id=f"{rejection.job_id}.rejected",
                job_id=rejection.job_id,
                kind="rejected",
                state=JobState.REJECTED,
                reason=f"{rejection.field}: {rejection.reason}",
            )
            await publish(self.js, subjects.job_event(rejection.job_id, "rejected"), event)

    async def _accept(self, sub: SubmitJob, owner: str | None = None) -> None:
        job_id = sub.job_id or f"{sub.spec.metadata.name}-{sub.event_id[:8]}"
        now = time.time()
        gang = sub.spec.spec.gang_size
        record = JobRecord(
            job_id=job_id,
            spec=sub.spec,
            submitted_at=sub.ts,
            updated_at=now,
            pods=[PodRecord(name=f"{job_id}-{i}", index=i) for i in range(gang)],
            owner=owner,
            trace_parent=current_traceparent(),  # queue.submit's (a child of the submitter's): the placer goes on
        )
        score = pending_score(sub.spec.metadata.priority_class, sub.ts)
        if not await self._create(record, score):
            # The same id again (a client retrying, or a user resubmitting with --job-id): the same job. Its
            # verdict is the job as it stands, so a retry never makes a second job nor sets one back to pending.
            existing = await self.jobs.get(job_id)
            if existing is not None and (existing.spec != sub.spec or existing.owner != owner):
                await self._reject(JobRejected(job_id=job_id, field="job_id", reason="job id already in use"), owner)
                return
            log.info("job_duplicate_submit", job_id=job_id, state=existing.state.value if existing else None)
            if existing is not None:
                await self.events.publish(existing, "queued", reason="duplicate submission: same job")
                return
        else:
            log.info("job_queued", job_id=job_id, queue=sub.spec.metadata.queue, pods=gang, tenant=owner)
        await self.events.publish(record, "queued", reason="")  # the placer's kick (it follows 'queued')

    async def _on_cancel(self, msg: Msg, owner: str | None = None) -> None:
        try:
            cancel = CancelJob.model_validate_json(msg.data)
        except ValueError as exc:
            log.warning("bad_cancel", error=str(exc))
            return

        def change(record: JobRecord) -> bool:
            if owner is not None and record.owner != owner:
                log.warning("cancel_refused", job_id=cancel.job_id, tenant=owner, reason="not the job's owner")
                return False
            return request_cancel(record, cancel.reason, time.time())  # the one rule (tide.core.lifecycle)

        record = await self.jobs.update(cancel.job_id, change)
        if record is None:
            return
        log.info("job_cancel", job_id=cancel.job_id, state=record.state)
        if record.state == JobState.CANCELLED:
            await self.jobs.dequeue(cancel.job_id)
            await self.events.publish(record, "cancelled")
        else:
            await self.jobs.request_stop(cancel.job_id)
            self.kicker.kick()

    # ------------------------------------------------------------ APIs
    async def _api_status(self, msg: Msg) -> None:
        """A job or the recent jobs; on a tenant's subject (tide.api.status.<tenant>) only that tenant's."""
        tenant = subjects.tenant_of(msg.subject)
        try:
            req = json.loads(msg.data or b"{}")
            job_id = req.get("job_id")
            if job_id:
                record = await self.jobs.get(job_id)
                if record is not None and (tenant is None or record.owner == tenant):
                    body = {"jobs": [json.loads(record.to_json())]}
                else:
                    rej = await self.redis.get(keys.rejected(job_id if record is None else f"{job_id}.{tenant}"))
                    info = json.loads(rej) if rej else None
                    if info and (tenant is None or record is not None or info.get("owner") == tenant):
                        info.pop("owner", None)
                        body = {"jobs": [], "rejected": {"job_id": job_id, **info}}
                    else:
                        body = {"jobs": [], "error": f"no job {job_id!r}"}
            else:
                limit = int(req.get("limit", 50))
                if tenant is None:
                    records = await self.jobs.recent(limit)
                else:  # the tenant's among the recent jobs
                    records = [r for r in await self.jobs.recent(max(limit * 20, 1000)) if r.owner == tenant][:limit]
                body = {"jobs": [json.loads(r.to_json()) for r in records]}
        except Exception as exc:
            body = {"jobs": [], "error": repr(exc)}
        await msg.respond(json.dumps(body).encode())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_history(self, msg: Msg) -> None:
        self._spawn(self._api_history(msg))

    async def _on_logs(self, msg: Msg) -> None:
        self._spawn(self._api_logs(msg))

    async def owned(self, job_id: str, tenant: str) -> bool:
        """Whether ``job_id`` is ``tenant``'s job: its record's owner, or for a job rejected without a record
        (the job id was new), the owner its rejection was kept for."""
        record = await self.jobs.get(job_id)
        if record is not None:
            return record.owner == tenant
        rej = await self.redis.get(keys.rejected(job_id))
        return rej is not None and json.loads(rej).get("owner") == tenant

    async def _api_history(self, msg: Msg) -> None:
        """A tenant's `tide describe JOB` (tide.api.history.<tenant>, ``{"job_id"}``): the job's events from the
        EVENTS stream and its dead letters, only for the tenant's own job. Another's job (or none) answers
        ``{"error": "no job ..."}`` with only the dead letters of messages the tenant itself sent naming that id.
        Reply: ``{"events": [JobEvent...], "dead_letters": [DeadLetter...], "truncated"?, "error"?}``."""
        tenant = subjects.tenant_of(msg.subject) or ""
        try:
            req = json.loads(msg.data or b"{}")
            job_id = req.get("job_id") if isinstance(req, dict) else None
            if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
                body: dict[str, Any] = {"events": [], "dead_letters": [], "error": f"bad job_id {job_id!r}"}
            else:
                mine = await self.owned(job_id, tenant)
                letters = [d for d in await self._dead_letters(job_id) if letter_visible(d, tenant, mine)]
                body = {"events": [], "dead_letters": [d.model_dump() for d in letters]}
                if mine:
                    events, truncated = await self._job_events(job_id)
                    body["events"] = events
                    if truncated:
                        body["truncated"] = True
                else:
                    log.info("history_refused", job_id=job_id, tenant=tenant, reason="not the tenant's job")
                    body["error"] = f"no job {job_id!r}"
        except Exception as exc:  # noqa: BLE001 - the requester gets the reason, the service goes on
            log.warning("history_failed", error=repr(exc), tenant=tenant)
            body = {"events": [], "dead_letters": [], "error": repr(exc)}
        await msg.respond(json.dumps(body).encode())

    async def _job_events(self, job_id: str) -> tuple[list[Any], bool]:
        events: list[Any] = []
        size = 0
        for m in await self._stream_messages("EVENTS", subjects.job_events(job_id), HISTORY_MAX_EVENTS + 1):
            size += len(m.data or b"")
            if len(events) >= HISTORY_MAX_EVENTS or size > HISTORY_MAX_BYTES:
                return events, True
            try:
                events.append(json.loads(m.data or b"null"))
            except ValueError:
                continue
        return events, False

    async def _dead_letters(self, job_id: str) -> list[DeadLetter]:
        if not is_job_token(job_id):
            return []
        found = [DeadLetter.from_headers(m.headers)
                 for m in await self._stream_messages("DLQ", subjects.job_dead_letters(job_id), 100)]
        return [d for d in found if d is not None]

    async def _stream_messages(self, stream: str, subject: str, limit: int) -> list[RawStreamMsg]:
        """The messages of ``stream`` on ``subject`` (wildcards allowed), oldest first, read one by one with
        ``$JS.API.STREAM.MSG.GET`` (next by subject): no consumer is made."""
        out: list[RawStreamMsg] = []
        seq = 1
        while len(out) < limit:
            try:
                m = await self.js.get_msg(stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break
            out.append(m)
            seq = (m.seq or seq) + 1
        return out

    async def _api_logs(self, msg: Msg) -> None:
        """A tenant's `tide logs` (tide.api.logs.<tenant>, ``{"node", "request", "timeout_s"?}``): the request
        goes on to the node's agent (tide_node_agent/logs.py) only when its ``job_id`` is the tenant's job, and
        the agent's reply comes back as it is. Otherwise ``{"ok": false, "error"}``; a node that does not answer:
        ``{"ok": false, "unreachable": true, "error"}``."""
        tenant = subjects.tenant_of(msg.subject) or ""
        body: dict[str, Any]
        try:
            req = json.loads(msg.data or b"{}")
            node = req.get("node") if isinstance(req, dict) else None
            inner = req.get("request") if isinstance(req, dict) else None
            job_id = inner.get("job_id") if isinstance(inner, dict) else None
            if not isinstance(node, str) or not _NODE_ID.match(node):
                body = {"ok": False, "error": f"bad node {node!r}"}
            elif not isinstance(job_id, str) or not _JOB_ID.match(job_id):
                body = {"ok": False, "error": f"bad job_id {job_id!r}"}
            elif not await self.owned(job_id, tenant):
                log.info("logs_refused", job_id=job_id, tenant=tenant, reason="not the tenant's job")
                body = {"ok": False, "error": f"no job {job_id!r}"}
            else:
                timeout = min(max(float(req.get("timeout_s", LOGS_TIMEOUT_S)), 0.1), 10.0)
                try:
                    reply = await self.nc.request(subjects.node_logs(node), json.dumps(inner).encode(),
                                                  timeout=timeout)
                except (nats.errors.NoRespondersError, nats.errors.TimeoutError, TimeoutError):
                    body = {"ok": False, "unreachable": True, "error": f"node {node} is not answering"}
                else:
                    await msg.respond(reply.data)
                    return
        except Exception as exc:  # noqa: BLE001
            log.warning("logs_failed", error=repr(exc), tenant=tenant)
            body = {"ok": False, "error": repr(exc)}
        await msg.respond(json.dumps(body).encode())

    async def apply_queue_config(self, config: object) -> QueueTree:
        """Validate and store the queue tree; the placer uses it from its next cycle on."""
        tree = QueueTree.from_config(config)  # raises ValueError with the reason
        parse_tides(config)  # type: ignore[arg-type]
        await self.redis.set(keys.QUEUE_CONFIG, json.dumps(config))
        log.info("queue_config_applied", queues=sorted(q for q in tree.queues if q))
        self.kicker.kick()
        return tree

    async def _api_queues_apply(self, msg: Msg) -> None:
        try:
            config = yaml.safe_load(msg.data)
            tree = await self.apply_queue_config(config)
            body = {"ok": True, "queues": sorted(q for q in tree.queues if q)}
        except (ValueError, TypeError, KeyError, yaml.YAMLError) as exc:
            body = {"ok": False, "error": str(exc)}
        await msg.respond(json.dumps(body).encode())

    async def _api_queues(self, msg: Msg) -> None:
        raw = await self.redis.get(keys.QUEUE_CONFIG)
        tree = QueueTree.from_config(json.loads(raw) if raw else None)
        records = await self.jobs.recent(5000)
        queues: dict[str, dict[str, object]] = {}
        for path, spec in tree.queues.items():
            if path:
                queues[path] = queue_row(spec.weight, dict(spec.guarantee), dict(spec.limit or {}))
        for r in records:
            q = queues.setdefault(r.spec.metadata.queue, queue_row())
            q[r.state.value] = int(q[r.state.value]) + 1  # type: ignore[call-overload]
            if r.state == JobState.RUNNING:
                demand = job_demand(r.spec)["gpu"]
                for path in tree.ancestors(tree.resolve(r.spec.metadata.queue)):
                    row = queues.setdefault(path, queue_row())
                    row["gpus_in_use"] = float(row["gpus_in_use"]) + demand  # type: ignore[arg-type]
        await msg.respond(json.dumps({"queues": queues}).encode())


def queue_row(weight: float = 1.0, guarantee: dict | None = None, limit: dict | None = None) -> dict[str, object]:
    return {"weight": weight, "guarantee": guarantee or {}, "limit": limit or {}, "gpus_in_use": 0.0,
            **{s.value: 0 for s in JobState}}


def letter_visible(letter: DeadLetter, tenant: str, owns_job: bool) -> bool:
    """Which of a job's dead letters a tenant sees: those of messages it sent itself (its own submit and cancel
    subjects) and, for its own job, those of the job's events; never what another tenant or the admin sent
    naming that id."""
    sender = subjects.tenant_of(letter.subject)
    if sender is not None or letter.subject.startswith(f"{subjects.PREFIX}.jobs."):
        return sender == tenant
    return owns_job and letter.subject.startswith(f"{subjects.PREFIX}.events.job.")


def intake_order_key(msg: Msg) -> str:
    """Submissions and cancellations of one job are handled in order; different jobs concurrently.

    The job id comes from the ``Tide-Job-Id`` header the clients set, else from the JSON body; a message
    with neither goes with the others like it, one at a time."""
    job_id = (msg.headers or {}).get("Tide-Job-Id")
    if job_id:
        return str(job_id)
    try:
        body = json.loads(msg.data)
    except ValueError:
        return ""
    return str(body.get("job_id") or "") if isinstance(body, dict) else ""
