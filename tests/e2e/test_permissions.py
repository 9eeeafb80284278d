"""The permission matrix on a real NATS server: every generated user x subjects and JetStream API calls,
allowed or denied as tide/stack/auth.py intends (a denial is a permissions violation on the connection)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from tide.stack.auth import Tenant
from tide.stack.launcher import Stack

from tests.helpers import small_node

USERS = ("queue", "placer", "metrics", "admin", "node-n0", "alice")
INBOXES = {"queue": "_INBOX_queue", "metrics": "_INBOX_metrics", "placer": "_INBOX_placer", "node-n0": "_INBOX_n0",
           "alice": "_INBOX_alice"}
ALL = frozenset(USERS)

# subject -> the users allowed to publish to it; (subject, users tested) where a publish could do harm
PUBLISH: list[tuple[str, set[str], frozenset[str]]] = [
    ("tide.jobs.submit", {"admin", "metrics"}, ALL),
    ("tide.jobs.cancel", {"admin"}, ALL),
    ("tide.jobs.submit.alice", {"alice", "metrics"}, ALL),  # metrics: an OOM resubmission of alice's job
    ("tide.jobs.cancel.alice", {"alice"}, ALL),
    ("tide.jobs.submit.bob", {"metrics"}, ALL),
    ("tide.jobs.rejected", {"queue"}, ALL),
    ("tide.api.status", {"admin"}, ALL),
    ("tide.api.status.alice", {"admin", "alice"}, ALL),
    ("tide.api.status.bob", {"admin"}, ALL),
    # a tenant's describe and logs: the queue answers them for its own jobs only
    ("tide.api.history.alice", {"admin", "alice"}, ALL),
    ("tide.api.history.bob", {"admin"}, ALL),
    ("tide.api.logs.alice", {"admin", "alice"}, ALL),
    ("tide.api.logs.bob", {"admin"}, ALL),
    ("tide.node.n0.logs", {"admin", "queue"}, ALL),
    # the feedback weights: every tenant's jobs on the shared subject (the admin's); a tenant's only on its own
    ("tide.api.weights", {"admin"}, ALL),
    ("tide.api.weights.alice", {"admin", "alice"}, ALL),
    ("tide.api.weights.bob", {"admin"}, ALL),
    ("tide.api.queues", {"admin", "alice"}, ALL),
    ("tide.api.queues.apply", {"admin"}, ALL - {"admin"}),
    ("tide.events.job.x.queued", {"queue", "placer"}, ALL),
    ("tide.node.n0.cmd", {"placer"}, ALL - {"placer"}),
    ("tide.node.n0.status", {"node-n0"}, ALL - {"node-n0"}),
    ("tide.node.n1.status", set(), ALL),
    ("tide.telemetry.n1", set(), ALL),
    ("tide.placer.weights", {"metrics"}, ALL - {"metrics"}),
    ("tide.placer.kick", {"queue", "admin"}, ALL),
    # the JetStream API: each service only its own consumers; only the queue (and admin) create streams
    ("$JS.API.STREAM.INFO.JOBS", {"queue", "placer", "metrics", "admin"}, ALL),
    ("$JS.API.STREAM.CREATE.JOBS", {"queue", "admin"}, ALL - {"queue", "admin"}),
    ("$JS.API.STREAM.UPDATE.EVENTS", {"queue", "admin"}, ALL - {"queue", "admin"}),
    ("$JS.API.STREAM.DELETE.JOBS", {"admin"}, ALL - {"admin"}),
    ("$JS.API.STREAM.PURGE.EVENTS", {"admin"}, ALL - {"admin"}),
    ("$JS.API.STREAM.MSG.GET.EVENTS", {"admin", "queue"}, ALL - {"admin"}),  # queue: a tenant's describe
    ("$JS.API.STREAM.MSG.GET.DLQ", {"admin", "queue"}, ALL - {"admin"}),
    ("$JS.API.DIRECT.GET.EVENTS", {"admin"}, ALL - {"admin"}),
    ("$JS.API.CONSUMER.CREATE.JOBS.queue-intake", {"queue", "admin"}, ALL - {"queue", "admin"}),
    ("$JS.API.CONSUMER.MSG.NEXT.JOBS.queue-intake", {"queue", "admin"}, ALL - {"queue", "admin"}),
    ("$JS.API.CONSUMER.MSG.NEXT.NODE.placer-node-status", {"placer", "admin"}, ALL - {"placer", "admin"}),
    ("$JS.API.CONSUMER.MSG.NEXT.EVENTS.metrics-events", {"metrics", "admin"}, ALL - {"metrics", "admin"}),
    ("$JS.API.CONSUMER.CREATE.EVENTS.snoop", {"admin"}, ALL - {"admin"}),
    ("$JS.API.CONSUMER.CREATE.JOBS.queue-intake.tide.jobs.>", {"queue", "admin"}, ALL - {"queue", "admin"}),
    ("$JS.API.CONSUMER.DELETE.JOBS.queue-intake", {"admin"}, ALL - {"admin"}),
    ("$JS.ACK.JOBS.queue-intake.1.1.1.1.1", {"queue"}, ALL - {"queue"}),
    ("$JS.ACK.EVENTS.metrics-events.1.1.1.1.1", {"metrics"}, ALL - {"metrics"}),
    # dead letters (tide.bus.nats.dead_letter): each service only on its own consumers' subjects
    ("tide.dlq.queue-intake.perm-probe", {"queue"}, ALL),
    ("tide.dlq.placer-node-status._", {"placer"}, ALL),
    ("tide.dlq.metrics-events._", {"metrics"}, ALL),
    ("tide.dlq.metrics-dead-letters._", {"metrics"}, ALL),
    ("tide.dlq.queue-intake.a.b", set(), ALL),
    ("$JS.API.STREAM.INFO.DLQ", {"queue", "placer", "metrics", "admin"}, ALL),
    ("$JS.API.CONSUMER.MSG.NEXT.DLQ.metrics-dead-letters", {"metrics", "admin"}, ALL - {"metrics", "admin"}),
    ("$JS.ACK.DLQ.metrics-dead-letters.1.1.1.1.1", {"metrics"}, ALL - {"metrics"}),
]

SUBSCRIBE: list[tuple[str, set[str]]] = [
    ("tide.events.>", {"metrics", "admin"}),
    ("tide.jobs.rejected", {"admin"}),
    ("tide.jobs.>", set()),
    ("tide.api.status", {"queue"}),
    ("tide.api.status.*", {"queue"}),
    ("tide.api.history.*", {"queue"}),
    ("tide.api.logs.*", {"queue"}),
    ("tide.api.weights", {"metrics"}),
    ("tide.api.weights.*", {"metrics"}),
    ("tide.events.job.x.>", {"metrics", "admin"}),
    ("tide.node.n0.logs", {"node-n0"}),
    ("tide.node.n0.cmd", {"node-n0"}),
    ("tide.node.*.cmd", set()),
    ("tide.telemetry.>", {"placer", "metrics"}),
    ("_INBOX.>", {"admin"}),
    ("_INBOX_queue.>", {"queue"}),
    ("_INBOX_metrics.>", {"metrics"}),
    ("_INBOX_alice.>", {"alice"}),
    ("_INBOX_n0.>", {"node-n0"}),
    ("tide.dlq.>", set()),
    (">", set()),
]


@pytest.fixture
def perm_stack(make_stack) -> Stack:
    return make_stack([small_node("n0", gpus=1), small_node("n1", gpus=1)],
                      tenants=[Tenant("alice", queues=["team-a"])])


async def probe(stack: Stack, user: str) -> str:
    """Every publish and subscription of the matrix as ``user``; the connection's errors, lowercased."""
    info = stack.info
    assert info is not None
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(info.nats_url, user=user, password=info.passwords[user], error_cb=on_error,
                            inbox_prefix=INBOXES.get(user, "_INBOX"), max_reconnect_attempts=0)
    try:
        for subject, _, tested in PUBLISH:
            if user in tested:
                await nc.publish(subject, b"")
        for subject, _ in SUBSCRIBE:
            await nc.subscribe(subject)
        await nc.flush()
        await asyncio.sleep(0.5)
        await nc.flush()
    finally:
        await nc.close()
    return " ".join(str(e) for e in errors).lower()


async def test_permission_matrix(perm_stack: Stack) -> None:
    wrong: list[str] = []
    for user in USERS:
        text = await probe(perm_stack, user)
        for subject, allowed, tested in PUBLISH:
            if user not in tested:
                continue
            denied = f'permissions violation for publish to "{subject.lower()}"' in text
            if denied == (user in allowed):
                wrong.append(f"{user} publish {subject}: {'denied' if denied else 'allowed'}")
        for subject, allowed in SUBSCRIBE:
            denied = f'permissions violation for subscription to "{subject.lower()}"' in text
            if denied == (user in allowed):
                wrong.append(f"{user} subscribe {subject}: {'denied' if denied else 'allowed'}")
    assert not wrong, "\n".join(wrong)


async def test_services_work_with_their_own_inboxes(perm_stack: Stack) -> None:
    """The stack works under the matrix: a job submitted through the queue is placed and runs."""
    from tide.client import TideClient

    from tests.helpers import job

    client = await TideClient.connect(perm_stack.info.settings_for("admin"))
    try:
        assert (await client.submit(job("ok", ["true"], gpu=1), job_id="perm-ok")).accepted
        done = await client.wait("perm-ok", timeout_s=60)
        assert done["state"] == "succeeded", done
    finally:
        await client.close()
