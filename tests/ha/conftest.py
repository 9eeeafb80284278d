"""An HA stack (3 NATS servers, Redis primary + replica + 3 Sentinels) and helpers to find and time its leaders."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from tide.client import TideClient
from tide.stack.auth import SENTINEL_PASSWORD
from tide.stack.launcher import HOST, Stack, sentinel_view

from tests.conftest import StackFactory

T = TypeVar("T")
RESULTS: dict[str, float] = {}  # measured recovery times, printed at the end of the session (docs/ha.md)


@pytest.fixture
def ha_stack(make_stack: StackFactory) -> Stack:
    return make_stack(ha=True)


@pytest.fixture
async def ha_client(ha_stack: Stack) -> AsyncIterator[TideClient]:
    assert ha_stack.info is not None
    c = await TideClient.connect(ha_stack.info.settings_for("admin"))
    yield c
    await c.close()


def nats_process(server_name: str) -> str:
    """``tide-1`` -> ``nats``, ``tide-2`` -> ``nats-2`` (the stack's process names)."""
    index = int(server_name.rsplit("-", 1)[1])
    return "nats" if index == 1 else f"nats-{index}"


def server_of_client(stack: Stack, client_name: str) -> str:
    """The NATS server process a named client (e.g. ``tide-queue``) is connected to, from each server's /connz."""
    assert stack.info is not None
    for process, port in stack.info.monitor_ports.items():
        if process in stack.held:
            continue
        with urllib.request.urlopen(f"http://{HOST}:{port}/connz?limit=1024", timeout=2) as reply:
            connz = json.loads(reply.read())
        if any(c.get("name") == client_name for c in connz.get("connections", [])):
            return process
    raise AssertionError(f"no NATS server has a connection named {client_name}")


def redis_master_port(stack: Stack) -> int | None:
    """The master's port as the first Sentinel that answers names it (None while none answers)."""
    info = stack.info
    assert info is not None
    for name in ("sentinel-1", "sentinel-2", "sentinel-3"):
        try:
            view = sentinel_view(HOST, info.ports[name], info.passwords[SENTINEL_PASSWORD], info.redis_master_name)
            return int(view["port"])
        except Exception:
            continue
    return None


async def retry(action: Callable[[], Awaitable[T]], timeout_s: float, what: str) -> T:
    """``action`` until it succeeds (failures meanwhile are what a failover looks like to a client)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await action()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: still failing after {timeout_s}s: {exc!r}") from exc
            await asyncio.sleep(0.2)


def record(name: str, seconds: float) -> None:
    RESULTS[name] = round(seconds, 2)
    print(f"\nHA recovery: {name} = {seconds:.2f} s", flush=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if RESULTS:
        terminalreporter.write_sep("-", "HA recovery times (s)")
        for name, seconds in RESULTS.items():
            terminalreporter.write_line(f"{name}: {seconds}")
