"""A node agent killed with -9: the node is declared lost and its jobs are requeued whole."""

from __future__ import annotations

import signal

from tide.client import TideClient

from tests.helpers import job, small_node


async def test_killed_agent_loses_its_node_and_the_gang_is_requeued_whole(make_stack) -> None:
    stack = make_stack([small_node(f"n{i}", gpus=8) for i in range(3)], env={"placer": {"TIDE_NODE_LOST_AFTER_S": "3"}})
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        spec = job("survivor", ["sleep", "2"], replicas=2, gpu=8)
        assert (await client.submit(spec, job_id="lost-gang")).accepted
        first = await client.wait("lost-gang", states={"running"}, timeout_s=30)
        victim = first["pods"][0]["node"]
        stack.kill(f"agent-{victim}", signal.SIGKILL)
        done = await client.wait("lost-gang", timeout_s=60)
        assert done["state"] == "succeeded"
        assert done["attempts"] == 2
        assert victim not in {p["node"] for p in done["pods"]}
        nodes = {n["node_id"]: n for n in await client.nodes()}
        assert nodes[victim]["lost"] is True
        assert nodes[victim]["gpus_used_milli"] == 0
        assert sum(n["gpus_used_milli"] for n in nodes.values()) == 0
    finally:
        await client.close()
