"""A node agent killed with -9: the node is declared lost and its jobs are requeued whole."""

from __future__ import annotations

import signal
from pathlib import Path

from tide.client import TideClient

from tests.e2e.test_fencing import live_pods, until, witness_job
from tests.helpers import job, small_node


async def test_killed_agent_loses_its_node_and_the_gang_is_requeued_whole(make_stack) -> None:
    stack = make_stack([small_node(f"n{i}", gpus=8) for i in range(3)], env={
        "placer": {"TIDE_NODE_LOST_AFTER_S": "3"},
        "agents": {"TIDE_NODE_LEASE_S": "2", "TIDE_FENCE_GRACE_S": "1", "TIDE_HEARTBEAT_S": "0.5"}})
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


async def test_agent_stalled_past_its_lease_is_fenced_and_its_node_comes_back(make_stack, tmp_path: Path) -> None:
    """SIGSTOP past the loss window and the lease: the job moves on; on resume the agent's old pod is
    stopped (it fenced itself; the placer stops what it reports), and the node, heartbeating again and
    running nothing stale, takes pods again without a re-registration."""
    witness = tmp_path / "witness"
    stack = make_stack([small_node(f"n{i}", gpus=8) for i in range(2)], env={
        "placer": {"TIDE_NODE_LOST_AFTER_S": "2"},
        "agents": {"TIDE_NODE_LEASE_S": "2", "TIDE_FENCE_GRACE_S": "1", "TIDE_HEARTBEAT_S": "0.5"}})
    client = await TideClient.connect(stack.info.settings_for("admin"))
    stalled = None
    try:
        assert (await client.submit(witness_job("stall", witness, 1, 8, 60), job_id="stalled")).accepted
        first = await client.wait("stalled", states={"running"}, timeout_s=30)
        stalled = first["pods"][0]["node"]
        stack.procs[f"agent-{stalled}"].send_signal(signal.SIGSTOP)

        async def moved():
            j = await client.job("stalled")
            return j if j["attempts"] >= 2 and j["state"] == "running" else None

        second = await until(moved, 60, 0.2)
        assert second and second["pods"][0]["node"] != stalled, await client.job("stalled")
        nodes = {n["node_id"]: n for n in await client.nodes()}
        assert nodes[stalled]["lost"] is True
        stack.procs[f"agent-{stalled}"].send_signal(signal.SIGCONT)
        stalled_node, stalled = stalled, None

        async def fenced_and_back():
            pods = live_pods(witness)
            current = (await client.job("stalled"))["attempts"]
            nodes = {n["node_id"]: n for n in await client.nodes()}
            ok = pods and all(p["attempt"] == current for p in pods) and not nodes[stalled_node]["lost"]
            return pods if ok else None

        pods = await until(fenced_and_back, 20, 0.2)
        assert pods, (live_pods(witness), await client.nodes())
        assert len(pods) == 1
        # the node takes pods again: a job that needs both nodes runs
        assert (await client.submit(job("both", ["true"], replicas=2, gpu=4), job_id="both")).accepted
        assert (await client.wait("both", timeout_s=30))["state"] == "succeeded"
        await client.cancel("stalled")
        assert (await client.wait("stalled", timeout_s=30))["state"] == "cancelled"
    finally:
        if stalled:
            stack.procs[f"agent-{stalled}"].send_signal(signal.SIGCONT)
        await client.close()
