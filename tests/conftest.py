"""Shared fixtures: real NATS (JetStream) and Redis servers on free ports, and whole stacks."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from tide.client import TideClient
from tide.schemas.node import NodeDescription, default_h100_node
from tide.stack.launcher import Stack
from tide.stack.servers import free_port, redis_server_binary, wait_tcp


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A bare Redis-compatible server (no auth) for store-level tests."""
    port = free_port()
    proc = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_tcp("127.0.0.1", port)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


StackFactory = Callable[..., Stack]


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[StackFactory]:
    stacks: list[Stack] = []

    def make(nodes: list[NodeDescription] | None = None, **options: object) -> Stack:
        stack = Stack(tmp_path / f"home{len(stacks)}", nodes or [default_h100_node("node-0"),
                                                                 default_h100_node("node-1")], **options)
        stacks.append(stack)
        stack.start()
        return stack

    yield make
    for stack in stacks:
        stack.stop()


@pytest.fixture
def stack(make_stack: StackFactory) -> Stack:
    return make_stack()


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[TideClient]:
    assert stack.info is not None
    c = await TideClient.connect(stack.info.settings_for("admin"))
    yield c
    await c.close()


