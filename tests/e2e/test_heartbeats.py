"""A node's heartbeats: one message per beat, on its telemetry subject when it carries GPU samples (the TELEMETRY
stream keeps those, metrics reads them), else on its heartbeat subject (kept by no stream). The placer takes both
as the node's liveness."""

from __future__ import annotations

import asyncio
import time

import nats
from tide import subjects
from tide.client import TideClient

# samples only on each agent's first beat; beats every 0.2 s; a node silent for 2 s is lost
ENV = {
    "agent-node-0": {"TIDE_HEARTBEAT_S": "0.2", "TIDE_TELEMETRY_S": "3600"},
    "agent-node-1": {"TIDE_HEARTBEAT_S": "0.2", "TIDE_TELEMETRY_S": "3600"},
    "placer": {"TIDE_NODE_LOST_AFTER_S": "2"},
}


async def test_beats_without_samples_keep_a_node_alive_and_only_beats_with_samples_are_kept(make_stack) -> None:
    stack = make_stack(env=ENV)
    info = stack.info
    client = await TideClient.connect(info.settings_for("admin"))
    admin = await nats.connect(info.nats_url, user="admin", password=info.passwords["admin"])
    try:
        deadline = time.monotonic() + 30
        while len(nodes := await client.nodes()) < 2 or any(n["last_seen_s"] is None for n in nodes):
            assert time.monotonic() < deadline, nodes
            await asyncio.sleep(0.2)
        await asyncio.sleep(4.0)  # twice the time after which a silent node is lost: ~20 beats each, 1 with samples
        nodes = await client.nodes()
        assert [n["lost"] for n in nodes] == [False, False], nodes
        assert all(n["last_seen_s"] < 1.5 for n in nodes), nodes
        stream = await admin.jetstream().stream_info("TELEMETRY")
        assert stream.state.messages == 2, "only each agent's one beat with samples is kept"
        for node in ("node-0", "node-1"):
            kept = await admin.jetstream().get_last_msg("TELEMETRY", subjects.telemetry(node))
            assert b'"gpus":[{' in kept.data  # its samples
    finally:
        await admin.close()
        await client.close()
