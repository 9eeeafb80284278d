"""Elastic gangs and gang timeouts on real NATS, Redis and node agents: an elastic job takes the room it
finds beyond its minMember pods, gives back only an extra pod to a higher-priority job and takes it again
later; a gang past gangTimeoutSeconds fails with the reason, or shrinks and starts with what fits."""

from __future__ import annotations

from pathlib import Path

from tide.client import TideClient

from tests.e2e.test_fencing import live_pods, until, witness_job
from tests.helpers import job, small_node


def running_pods(record: dict) -> list[str]:
    return sorted(p["name"] for p in record["pods"] if p["state"] == "running" and p["node"])


async def test_elastic_job_runs_its_extras_and_gives_back_only_an_extra(make_stack, tmp_path: Path) -> None:
    witness = tmp_path / "witness"
    stack = make_stack([small_node("n0", gpus=3)])
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        spec = witness_job("elastic", witness, 4, 1, 120)
        spec["spec"]["minMember"] = 2
        spec["spec"]["gracePeriodSeconds"] = 1
        assert (await client.submit(spec, job_id="el")).accepted
        await client.wait("el", states={"running"}, timeout_s=30)

        async def three():
            j = await client.job("el")
            return j if len(running_pods(j)) == 3 else None

        first = await until(three, 20, 0.2)
        assert first, await client.job("el")
        assert running_pods(first) == ["el-0", "el-1", "el-2"]
        assert len(live_pods(witness)) == 3

        serve = job("serve", ["sleep", "2"], gpu=1)
        serve["metadata"]["priorityClass"] = "online-serving"
        assert (await client.submit(serve, job_id="serve")).accepted
        await client.wait("serve", states={"running"}, timeout_s=60)
        during = await client.job("el")  # while serve runs (once it is done, the extra may be back already)
        done = await client.wait("serve", timeout_s=60)
        assert done["state"] == "succeeded", done
        assert during["state"] == "running" and during["attempts"] == 1, during
        assert {"el-0", "el-1"} <= set(running_pods(during))
        assert during.get("preemptions", 0) == 0

        async def regrown():  # serve is gone: the extra comes back with a newer token beside the gang
            j = await client.job("el")
            pods = live_pods(witness)
            return j if len(running_pods(j)) == 3 and len(pods) == 3 else None

        again = await until(regrown, 30, 0.2)
        assert again, (await client.job("el"), live_pods(witness))
        assert again["state"] == "running"
        tokens = sorted(p["attempt"] for p in live_pods(witness))
        assert tokens[0] == 1 and tokens[1] == 1 and tokens[2] == again["attempts"] > 1
        await client.cancel("el")
        assert (await client.wait("el", timeout_s=30))["state"] == "cancelled"
        assert await until(lambda: _none_left(witness), 10, 0.2)
        nodes = await client.nodes()
        assert sum(n["gpus_used_milli"] for n in nodes) == 0
    finally:
        await client.close()


async def _none_left(witness: Path) -> bool:
    return not live_pods(witness)


async def test_gang_timeout_fails_with_the_reason_or_shrinks_to_what_fits(make_stack) -> None:
    stack = make_stack([small_node("n0", gpus=3)])
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        shrink = job("shrink", ["sleep", "60"], replicas=4, gpu=1)
        shrink["spec"].update({"gangTimeoutSeconds": 2, "onTimeout": "shrink", "gracePeriodSeconds": 1})
        assert (await client.submit(shrink, job_id="shrink")).accepted
        started = await client.wait("shrink", states={"running"}, timeout_s=30)

        async def three():
            j = await client.job("shrink")
            return j if len(running_pods(j)) == 3 else None

        started = await until(three, 20, 0.2)
        assert started, await client.job("shrink")
        body = await client.status("shrink")
        assert body["jobs"][0]["spec"]["spec"]["minMember"] == 1

        fail = job("strict", ["true"], replicas=2, gpu=1)
        fail["spec"]["gangTimeoutSeconds"] = 2
        assert (await client.submit(fail, job_id="strict")).accepted
        failed = await client.wait("strict", timeout_s=30)
        assert failed["state"] == "failed", failed
        assert failed["reason"] == "gang timeout: 2 of 2 pods could not be placed within 2s"
        assert all(p["node"] is None for p in failed["pods"])
        await client.cancel("shrink")
        assert (await client.wait("shrink", timeout_s=30))["state"] == "cancelled"
    finally:
        await client.close()
