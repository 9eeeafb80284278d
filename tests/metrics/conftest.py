"""Fast telemetry for the metrics tests: agents sample every 0.5 s, the metrics service polls Redis as often."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tide.client import TideClient
from tide.stack.launcher import Stack

from tests.conftest import StackFactory

FAST_AGENT = {"TIDE_HEARTBEAT_S": "0.5", "TIDE_TELEMETRY_S": "0.5"}
FAST_METRICS = {"TIDE_METRICS_POLL_S": "0.5"}


def fast_env(node_ids: list[str], metrics: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    env = {f"agent-{n}": dict(FAST_AGENT) for n in node_ids}
    env["metrics"] = {**FAST_METRICS, **(metrics or {})}
    return env


@pytest.fixture
def fast_stack(make_stack: StackFactory) -> Stack:
    return make_stack(env=fast_env(["node-0", "node-1"]))


@pytest.fixture
async def fast_client(fast_stack: Stack) -> AsyncIterator[TideClient]:
    assert fast_stack.info is not None
    c = await TideClient.connect(fast_stack.info.settings_for("admin"))
    yield c
    await c.close()
