"""Services and node agents authenticate; a node agent can speak only for itself."""

from __future__ import annotations

import asyncio

import nats
import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from tide import subjects
from tide.schemas.events import PodExited
from tide.stack.auth import node_user
from tide.stack.launcher import Stack
from tide.store import keys


async def _connect_as(stack: Stack, user: str, errors: list[Exception]):
    info = stack.info
    assert info is not None

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    return await nats.connect(
        info.nats_url, user=user, password=info.passwords[user], error_cb=on_error,
        inbox_prefix=subjects.node_inbox_prefix(user.removeprefix("node-")), max_reconnect_attempts=0,
    )


async def test_node_agent_cannot_publish_another_nodes_status(stack: Stack) -> None:
    errors: list[Exception] = []
    nc = await _connect_as(stack, node_user("node-0"), errors)
    js_admin = await nats.connect(stack.info.nats_url, user="admin", password=stack.info.passwords["admin"])
    try:
        forged = PodExited(node_id="node-1", job_id="victim", pod="victim-0", exit_code=0, reason="Completed")
        await nc.publish(subjects.node_status("node-1"), forged.to_bytes())
        await nc.publish(subjects.telemetry("node-1"), b"{}")
        await nc.publish(subjects.heartbeat("node-1"), b"{}")
        await nc.flush()
        for _ in range(40):
            if len(errors) >= 3:
                break
            await asyncio.sleep(0.05)
        text = " ".join(str(e) for e in errors).lower()
        assert 'permissions violation for publish to "tide.node.node-1.status"' in text
        assert 'permissions violation for publish to "tide.telemetry.node-1"' in text
        assert 'permissions violation for publish to "tide.heartbeat.node-1"' in text
        # nor may it listen to another node's commands or the job events
        await nc.subscribe(subjects.node_cmd("node-1"))
        await nc.subscribe(subjects.EVENTS_ALL)
        await nc.flush()
        await asyncio.sleep(0.2)
        text = " ".join(str(e) for e in errors).lower()
        assert 'permissions violation for subscription to "tide.node.node-1.cmd"' in text
        assert 'permissions violation for subscription to "tide.events.>"' in text
        # the forged status never reached the stream: node-1's last status is its own registration
        last = await js_admin.jetstream().get_last_msg("NODE", subjects.node_status("node-1"))
        assert b"victim" not in last.data and b'"registered"' in last.data
        own = errors.copy()
        await nc.publish(subjects.node_status("node-0"), b"{}")  # its own subject is allowed
        await nc.flush()
        await asyncio.sleep(0.2)
        assert errors == own
    finally:
        await nc.close()
        await js_admin.close()


async def test_wrong_password_is_refused(stack: Stack) -> None:
    with pytest.raises(Exception, match="(?i)authorization"):
        await nats.connect(stack.info.nats_url, user="placer", password="nope", max_reconnect_attempts=0,
                           allow_reconnect=False)


async def test_redis_requires_credentials_and_limits_keys(stack: Stack) -> None:
    info = stack.info
    anonymous = Redis(host=info.redis_host, port=info.redis_port)
    with pytest.raises((AuthenticationError, ResponseError)):
        await anonymous.ping()
    await anonymous.aclose()
    placer = Redis.from_url(info.redis_url("placer"))
    try:
        assert await placer.ping()
        await placer.set(f"{keys.PREFIX}:probe", "1")
        with pytest.raises(NoPermissionError):
            await placer.set("tide:probe", "1")  # the old, untagged layout is outside the ACL too
        with pytest.raises(NoPermissionError):
            await placer.set("other:probe", "1")
        with pytest.raises(NoPermissionError):
            await placer.flushall()
    finally:
        await placer.aclose()
