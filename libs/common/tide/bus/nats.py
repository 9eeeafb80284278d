"""NATS connection, JetStream stream/consumer set-up, publishing and durable consumption."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError
from redis import exceptions as redis_errors

from tide.bus.dead_letters import MAX_BODY, DeadLetter, describe_error, job_id_of
from tide.runtime import concurrently
from tide.schemas.events import Message
from tide.settings import Settings
from tide.store.claims import FencedOut
from tide.subjects import STREAMS, ConsumerDef
from tide.tracing import remote_parent, trace_headers

log = structlog.get_logger()


def nats_servers(url: str) -> list[str]:
    """``TIDE_NATS_URL`` may list several servers of one cluster, comma-separated."""
    return [u.strip() for u in url.split(",") if u.strip()]


def stream_replicas() -> int:
    """Replicas of every stream: ``TIDE_NATS_STREAM_REPLICAS`` (3 in an HA stack), default 1."""
    return int(os.environ.get("TIDE_NATS_STREAM_REPLICAS", "1") or "1")


async def connect(settings: Settings, name: str, inbox_prefix: str | None = None, **kwargs: Any) -> NATS:
    """Connect with credentials; reconnect forever when the server goes away (to another server of the
    cluster when ``settings.nats_url`` lists several, or one the cluster told us about)."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats_error", error=str(exc), client=name)

    async def on_disconnect() -> None:
        log.info("nats_disconnected", client=name)

    async def on_reconnect() -> None:
        log.info("nats_reconnected", client=name)

    options: dict[str, Any] = dict(
        servers=nats_servers(settings.nats_url),
        name=name,
        user=settings.nats_user,
        password=settings.nats_password,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        allow_reconnect=True,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )
    if inbox_prefix:
        options["inbox_prefix"] = inbox_prefix
    options.update(kwargs)
    return await nats.connect(**options)


async def close_nats(nc: NATS, timeout_s: float = 2.0) -> None:
    """Flush what we published, then close (the consumers have stopped, so nothing is in flight)."""
    try:
        await asyncio.wait_for(nc.flush(), timeout=timeout_s)
    except Exception:
        pass
    await nc.close()


async def ensure_streams(js: JetStreamContext, replicas: int | None = None) -> None:
    """Create or update every stream of ``tide.subjects.STREAMS`` (idempotent), each with ``replicas``
    copies (default: ``stream_replicas()``; the durable consumers inherit the stream's replicas)."""
    replicas = replicas if replicas is not None else stream_replicas()
    for sd in STREAMS:
        config = StreamConfig(
            name=sd.name,
            subjects=sd.subjects,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=sd.max_age_s,
            max_msgs_per_subject=sd.max_msgs_per_subject,
            max_msgs=sd.max_msgs,
            duplicate_window=sd.duplicate_window_s,
            description=sd.description,
            num_replicas=replicas,
            allow_batched=sd.allow_batched or None,
        )
        for attempt in range(STREAM_ATTEMPTS):  # a cluster electing a leader answers nothing for a few seconds
            try:
                await _create_or_update(js, config)
                break
            except nats.errors.TimeoutError:
                if attempt == STREAM_ATTEMPTS - 1:
                    raise
                log.warning("stream_setup_timeout", stream=sd.name, attempt=attempt + 1)
                await asyncio.sleep(0.5)


STREAM_ATTEMPTS = 6


def _same_stream(a: StreamConfig, b: StreamConfig) -> bool:
    keys = ("subjects", "retention", "storage", "max_age", "max_msgs_per_subject", "max_msgs", "duplicate_window",
            "description", "num_replicas", "allow_batched")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


async def _create_or_update(js: JetStreamContext, config: StreamConfig) -> None:
    """Update only a stream that differs: in a cluster each update is a proposal through the meta leader, and
    several services starting at once would otherwise queue them up."""
    assert config.name is not None
    try:
        info = await js.stream_info(config.name)
    except NotFoundError:
        await js.add_stream(config)
        return
    if not _same_stream(info.config, config):
        await js.update_stream(config)


async def publish(js: JetStreamContext, subject: str, message: Message,
                  headers: dict[str, str] | None = None) -> None:
    """Publish to JetStream with the event id as ``Nats-Msg-Id`` and the current span's ``traceparent`` (or the
    ``headers`` given, taken where the message was made), retrying while the server is away."""
    headers = headers or trace_headers({"Nats-Msg-Id": message.event_id})
    delay = 0.2
    for attempt in range(30):
        try:
            await js.publish(subject, message.to_bytes(), headers=headers)
            return
        except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError, nats.js.errors.NoStreamResponseError):
            if attempt == 29:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


BATCH_MAX = 500
"""Messages in one fast-ingest batch (``FastBatches.publish``): the server acks a batch at most every 500 messages,
so one of up to this many gets no acknowledgement but its first and its commit's."""

BATCH_FLOW = 500
"""The flow asked of the server (acknowledge every this many messages; it answers with its own, at most 500)."""

BATCH_ACK_TIMEOUT_S = 5.0


class BatchRefused(Exception):
    """The server refused a fast batch, or a message of it, so what was stored is not known: fast batches are off on
    the stream (err_code 10205), the server lost a message of it (a gap), a message failed a check, or the server
    does not know fast batches (``BATCH_UNKNOWN``)."""

    def __init__(self, err_code: int, description: str) -> None:
        super().__init__(f"fast batch refused ({err_code}): {description}")
        self.err_code = err_code


BATCH_DISABLED = 10205
"""``err_code`` of a batch sent to a stream without ``allow_batched``."""
BATCH_UNKNOWN = -1
"""``BatchRefused.err_code`` when the server's answer names no batch: a server older than 2.14 took each message as a
plain publish, so what was stored is unknown until they are sent again."""

_START, _APPEND, _COMMIT = 0, 1, 2  # the operation a fast batch's reply subject names


def batch_refusal(reply: dict[str, Any], seq: int, sent: int) -> BatchRefused | None:
    """What the server's answer to message ``seq`` of a fast batch of ``sent`` says against the batch: None for a
    flow acknowledgement, or for the commit's ack when it counts all ``sent`` messages (stored, or dropped as
    duplicates of stored ids)."""
    kind = reply.get("type")
    if kind == "ack":
        return None
    if kind == "gap":
        return BatchRefused(0, f"the server lost messages {reply.get('last_seq')} to {reply.get('seq')} of the batch")
    error = reply.get("error")
    if error:
        return BatchRefused(int(error.get("err_code", 0)), str(error.get("description", "")))
    if kind is not None:
        return BatchRefused(0, f"unexpected answer to message {seq}: {reply}")
    if "batch" not in reply:
        return BatchRefused(BATCH_UNKNOWN, f"the server does not know fast batches (its ack: {reply})")
    if seq == sent and reply.get("count") != sent:
        return BatchRefused(0, f"the server took {reply.get('count')} of {sent} messages")
    return None


@dataclass
class _OpenBatch:
    sent: int
    done: asyncio.Future[None]


class FastBatches:
    """Fast-ingest JetStream batches over one connection (ADR-50 "fast ingest", nats-server 2.14+; the stream needs
    ``allow_batched``). Each message is stored as it comes, as a plain publish is, and the server answers a batch
    twice: a flow acknowledgement of its first message and a publish ack of its commit (its last message). A batch
    of n costs n + 2 messages where a publish each costs 2n, and the server's work per message is a plain
    publish's: no staging, unlike an atomic batch.

    A batch is not atomic: a refusal (``BatchRefused``) or a timeout leaves some of it stored. Each message's
    ``Nats-Msg-Id`` is honoured, so the caller sends them again one by one and the server drops those it has.

    The batch's id is the last token of a fresh inbox of the connection (the server reads the reply subject
    ``<prefix>.<id>.<flow>.<gap>.<seq>.<op>.$FI`` from its end), and one subscription under the connection's own
    inbox prefix takes every batch's answers, so a client allowed only its inbox needs nothing more."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._open: dict[str, _OpenBatch] = {}
        self._listening: str | None = None  # the inbox prefix subscribed to

    async def publish(self, messages: list[tuple[str, bytes, dict[str, str]]],
                      timeout: float = BATCH_ACK_TIMEOUT_S) -> None:
        """Store ``messages`` (subject, payload, headers; one stream, at most ``BATCH_MAX``) as one fast batch and
        return once the server counted all of them. Raises ``BatchRefused``, or a nats timeout or connection
        error when the outcome is unknown."""
        if not 0 < len(messages) <= BATCH_MAX:
            raise ValueError(f"a fast batch holds 1 to {BATCH_MAX} messages, not {len(messages)}")
        inbox = self.nc.new_inbox()
        prefix, _, batch_id = inbox.rpartition(".")
        if self._listening != prefix:  # marked first: a batch sent meanwhile must not subscribe (and hear) twice
            self._listening = prefix
            try:
                await self.nc.subscribe(f"{prefix}.*.*.*.*.*.$FI", cb=self._on_reply)
            except Exception:  # not made (a cancellation, at shutdown, may come after it was: left marked)
                self._listening = None
                raise
        batch = _OpenBatch(len(messages), asyncio.get_running_loop().create_future())
        self._open[batch_id] = batch
        try:
            for seq, (subject, payload, headers) in enumerate(messages, start=1):
                op = _COMMIT if seq == batch.sent else _START if seq == 1 else _APPEND
                await self.nc.publish(subject, payload, reply=f"{inbox}.{BATCH_FLOW}.fail.{seq}.{op}.$FI",
                                      headers=headers)
            try:
                await asyncio.wait_for(asyncio.shield(batch.done), timeout)
            except TimeoutError:
                raise nats.errors.TimeoutError from None
        finally:
            del self._open[batch_id]
            if batch.done.done() and not batch.done.cancelled():
                batch.done.exception()  # a refusal is raised above, or dropped when publishing failed first

    async def _on_reply(self, msg: Msg) -> None:
        """An answer on ``<prefix>.<batch id>.<flow>.<gap>.<seq>.<op>.$FI`` (read from the end: the prefix may hold
        dots). A status without a body (503: no stream answered, as while a clustered stream elects its leader)
        says nothing about the stream's batches: a plain transient error, so batching stays on."""
        tokens = msg.subject.split(".")
        batch = self._open.get(tokens[-6]) if len(tokens) >= 7 else None
        if batch is None or batch.done.done():
            return
        status = (msg.headers or {}).get("Status")
        if status:
            batch.done.set_exception(nats.errors.NoRespondersError() if status == "503"
                                     else nats.errors.Error(f"status {status} in answer to a fast batch"))
            return
        seq, reply = 0, None
        try:
            seq, reply = int(tokens[-3]), json.loads(msg.data or b"")
            refused = batch_refusal(reply, seq, batch.sent)
        except Exception as exc:  # noqa: BLE001 - whatever came (no JSON, no object, an error that is a string)
            refused = BatchRefused(0, f"unreadable answer {msg.data[:200]!r}: {exc!r}")
        if refused is not None:
            batch.done.set_exception(refused)
        elif seq == batch.sent and "type" not in reply:
            batch.done.set_result(None)


Handler = Callable[[Msg], Awaitable[None]]


def dead_letter_after(cdef: ConsumerDef) -> int:
    """Deliveries a handler may fail before its message is dead-lettered: ``TIDE_DEAD_LETTER_AFTER`` or the
    consumer's own ``dead_letter_after``, never above its ``max_deliver``."""
    raw = os.environ.get("TIDE_DEAD_LETTER_AFTER", "")
    limit = int(raw) if raw.strip() else cdef.dead_letter_after
    return max(1, min(limit, cdef.max_deliver))


TRANSIENT: tuple[type[BaseException], ...] = (
    FencedOut,  # a placer that lost the lease: the message is the new leader's
    ConnectionError, TimeoutError, OSError,
    redis_errors.ConnectionError, redis_errors.TimeoutError, redis_errors.BusyLoadingError,
    redis_errors.ReadOnlyError, redis_errors.TryAgainError, redis_errors.MasterDownError,
    nats.errors.Error,
)
"""Errors that say nothing about the message (a server away, a failover): such a message is retried up to the
consumer's ``max_deliver`` and dead-lettered only at its last delivery."""


PULL_EXPIRES_S = 1.0
"""How long one pull request waits for messages: the server answers an unused one with a timeout status once a
second per consumer, and a consumer that stops leaves a request behind for at most this long."""


class Readable(Protocol):
    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool: ...


def socket_transport(nc: NATS) -> Readable | None:
    """The asyncio transport under the connection's socket now (a new one after each reconnect), or None while
    it has none (connecting, reconnecting, closed, or a nats-py that keeps it elsewhere: then it is read as
    usual)."""
    writer: Any = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    transport = getattr(writer, "transport", None)
    if transport is None or not hasattr(transport, "pause_reading"):
        return None
    return transport  # type: ignore[no-any-return]


LINGER_READ_S = 0.003
"""How long before a linger ends the consumer's socket is read again (``_linger``)."""


ARRIVAL_WINDOW_S = 0.25
"""How far back ``consume`` looks to tell how fast messages come (``linger_above_per_s``)."""


class ArrivalRate:
    """Messages per second over the last ``window_s`` (a sliding window of arrival times)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._times: deque[float] = deque()

    def note(self, now: float) -> None:
        self._times.append(now)
        self._forget(now)

    def per_s(self, now: float | None = None) -> float:
        self._forget(time.monotonic() if now is None else now)
        return len(self._times) / self.window_s

    def _forget(self, now: float) -> None:
        while self._times and self._times[0] < now - self.window_s:
            self._times.popleft()


async def consume(
    js: JetStreamContext,
    cdef: ConsumerDef,
    handler: Handler,
    stop: asyncio.Event,
    batch: int = 64,
    order_key: Callable[[Msg], str] | None = None,
    linger_s: float = 0.0,
    linger_above_per_s: float = 0.0,
) -> None:
    """Pull from a durable, explicit-ack consumer until ``stop`` is set.

    One pull request asks for up to ``batch`` messages and waits up to ``PULL_EXPIRES_S``: messages come as they
    are published, and what has come is handled together; the next request goes once this one is spent (all its
    messages came and were handled, or it expired). At a few messages a second that is one request a second,
    where nats-py's ``fetch`` sends one or two per message (a no-wait probe, then a waiting request) and the
    server answers each with a status message. At most ``batch`` messages are in hand at a time.

    The handler acks (or naks/terms) each message itself, inside the trace context the message carries (its
    ``traceparent`` header, ``tide.tracing.remote_parent``); an exception in the
    handler naks the message so it is redelivered, until it has failed
    ``dead_letter_after`` deliveries (``max_deliver`` for a transient error): then it
    goes to the DLQ stream with the reason and is terminated (no poison message
    blocks or crashes a service). With ``order_key``, the messages of a batch that
    share a key are handled in order and different keys concurrently (e.g. one job's
    pod events in order, many jobs at once); a key function that raises puts the
    message with the others whose key could not be read.

    With ``linger_s``, a batch is handled that long after its first message came, with whatever came meanwhile:
    messages that come close together are then handled together (one Redis call and one event batch for all,
    and one wake-up of each service downstream instead of one per message). With ``linger_above_per_s`` it
    lingers only while messages came at least that fast (over the last ``ARRIVAL_WINDOW_S``): a slow trickle,
    which a linger would only delay, is handled at once. While it lingers the connection's socket is not read
    (``_linger``): the messages that come meanwhile are read together near its end, one wake-up for all of them.
    """
    config = ConsumerConfig(
        durable_name=cdef.durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=cdef.ack_wait_s,
        max_deliver=cdef.max_deliver,
        filter_subjects=cdef.filter_subjects or None,
    )
    nc: NATS = js._nc  # the JetStream context's connection: pull requests and their inbox go over it
    next_subject = f"{js._prefix}.CONSUMER.MSG.NEXT.{cdef.stream}.{cdef.durable}"
    request = json.dumps({"batch": batch, "expires": int(PULL_EXPIRES_S * 1e9)}).encode()
    arrived: asyncio.Queue[Msg] = asyncio.Queue()

    recent = ArrivalRate(ARRIVAL_WINDOW_S)

    async def on_delivery(msg: Msg) -> None:
        arrived.put_nowait(msg)
        recent.note(time.monotonic())

    inbox_sub = None
    owed, expires_at = 0, 0.0  # messages the outstanding request may still bring, and when it lapses
    try:
        while not stop.is_set():
            try:
                if inbox_sub is None:
                    await js.add_consumer(cdef.stream, config)
                    inbox = nc.new_inbox()
                    inbox_sub = await nc.subscribe(inbox, cb=on_delivery)
                    owed = 0
                now = time.monotonic()
                if owed <= 0 or now > expires_at:
                    await nc.publish(next_subject, request, reply=inbox)
                    owed, expires_at = batch, now + PULL_EXPIRES_S + 0.5  # slack: the server's 408 comes first
                try:
                    first = await asyncio.wait_for(arrived.get(), timeout=min(0.5, max(0.01, expires_at - now)))
                except TimeoutError:
                    continue
                if linger_s > 0 and arrived.qsize() + 1 < owed and recent.per_s() >= linger_above_per_s:
                    await _linger(nc, linger_s)  # the request may bring more, and they come fast: gather them
            except Exception as exc:  # server away or consumer lost: back off and rebuild
                log.warning("consume_error", consumer=cdef.durable, error=repr(exc))
                await _unsubscribe(inbox_sub)
                inbox_sub = None
                await asyncio.sleep(0.5)
                continue
            msgs: list[Msg] = []
            for msg in [first, *_drain(arrived)]:
                status = JetStreamContext.is_status_msg(msg)
                if status is None:
                    msgs.append(msg)
                    owed -= 1
                elif status != "100":  # 408: the request expired; 409: max waiting, leader change, consumer gone
                    owed = 0
                    if status == "409" and "deleted" in str((msg.headers or {}).get("Description", "")).lower():
                        await _unsubscribe(inbox_sub)  # the consumer is made again
                        inbox_sub = None
            if not msgs:
                continue
            groups: dict[str, list[Msg]] = {}
            for i, msg in enumerate(msgs):
                groups.setdefault(_key(order_key, msg) if order_key else str(i // len(msgs)), []).append(msg)
            await concurrently([_handle_in_order(js, cdef, handler, group) for group in groups.values()])
    finally:
        await _unsubscribe(inbox_sub)
        for msg in _drain(arrived):  # came after the stop: redelivered now to whoever consumes next
            if JetStreamContext.is_status_msg(msg) is None:
                try:
                    await msg.nak()
                except Exception:  # noqa: BLE001 - redelivered after the ack wait instead
                    pass


async def _linger(nc: NATS, linger_s: float) -> None:
    """Wait ``linger_s``, most of it without reading ``nc``'s socket: what comes meanwhile stays in the kernel's
    buffer and is read in one go (``tide.bus.paced``), instead of waking the process once per message. Reading
    resumes ``LINGER_READ_S`` (at most a quarter of the linger) before its end, so what was kept is read and
    handed to the consumer in time for the batch (what is not joins the next one). The consumer's handlers are
    all done by then; another user of the connection waits as long for what comes to it (a reply)."""
    transport = socket_transport(nc)
    if transport is None or transport.is_closing():
        await asyncio.sleep(linger_s)
        return
    reading_s = min(LINGER_READ_S, linger_s / 4)
    transport.pause_reading()
    try:
        await asyncio.sleep(linger_s - reading_s)
    finally:
        if not transport.is_closing():
            transport.resume_reading()
    await asyncio.sleep(reading_s)


def _drain(arrived: asyncio.Queue[Msg]) -> list[Msg]:
    msgs: list[Msg] = []
    while not arrived.empty():
        msgs.append(arrived.get_nowait())
    return msgs


async def _unsubscribe(sub: Any) -> None:
    """Drop a pull inbox (None: there was none)."""
    if sub is not None:
        try:
            await sub.unsubscribe()
        except Exception:  # noqa: BLE001 - the connection is gone: so is the subscription
            pass


UNKEYED = ""  # like the queue's messages that name no job: one at a time


def _key(order_key: Callable[[Msg], str], msg: Msg) -> str:
    """The message's order key; a key function that fails on hostile bytes (deep JSON nesting raises
    RecursionError, a JSON list has no ``.get``) must not stop the consumer."""
    try:
        return order_key(msg)
    except Exception:  # noqa: BLE001 - whatever the payload: handled one at a time with the other unkeyed
        return UNKEYED


async def _handle_in_order(js: JetStreamContext, cdef: ConsumerDef, handler: Handler, msgs: list[Msg]) -> None:
    for msg in msgs:
        try:
            with remote_parent(msg.headers):  # the handler's spans continue the publisher's trace
                await handler(msg)
        except Exception as exc:
            await _handler_failed(js, cdef, msg, exc)


async def _handler_failed(js: JetStreamContext, cdef: ConsumerDef, msg: Msg, exc: Exception) -> None:
    """Nak for a redelivery; dead-letter (and terminate) the message once it failed often enough."""
    try:
        deliveries = msg.metadata.num_delivered
    except Exception:  # noqa: BLE001 - not a JetStream message: nothing to count
        deliveries = 0
    transient = isinstance(exc, TRANSIENT)
    log.error("handler_failed", consumer=cdef.durable, subject=msg.subject, error=repr(exc), deliveries=deliveries,
              transient=transient, exc_info=exc)
    give_up = deliveries >= cdef.max_deliver or (not transient and deliveries >= dead_letter_after(cdef))
    if give_up and await dead_letter(js, cdef, msg, exc, deliveries):
        try:
            await msg.term()
        except Exception:  # noqa: BLE001 - the ack is lost: redelivered, and deduplicated by the DLQ
            pass
        return
    try:
        await msg.nak(delay=1.0)
    except Exception:  # noqa: BLE001
        pass


async def dead_letter(js: JetStreamContext, cdef: ConsumerDef, msg: Msg, exc: Exception, deliveries: int) -> bool:
    """Publish ``msg`` to the DLQ stream with the reason; False when that failed (the message is nak'ed then)."""
    try:
        seq = msg.metadata.sequence.stream
    except Exception:  # noqa: BLE001
        seq = 0
    data = msg.data or b""
    letter = DeadLetter(consumer=cdef.durable, subject=msg.subject, stream=cdef.stream, stream_seq=seq,
                        job_id=job_id_of(data, msg.headers), error=describe_error(exc), deliveries=deliveries,
                        ts=time.time(), size=len(data))
    try:
        await js.publish(letter.dlq_subject(), data[:MAX_BODY], headers=letter.headers(), timeout=5.0)
    except Exception as publish_exc:  # noqa: BLE001 - NATS away, or not allowed: keep redelivering
        log.warning("dead_letter_failed", consumer=cdef.durable, subject=msg.subject, job_id=letter.job_id,
                    error=repr(publish_exc))
        return False
    log.error("dead_lettered", consumer=cdef.durable, subject=msg.subject, job_id=letter.job_id,
              error=letter.error, deliveries=deliveries, dlq_subject=letter.dlq_subject())
    return True
