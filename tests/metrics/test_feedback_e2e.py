"""The feedback loop on real NATS + Redis: OOM -> larger share -> success -> decay; heavy cross-node traffic
-> affinity -> one node next time. The metrics service does the observing, deciding and resubmitting."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from tide import subjects
from tide.bus.nats import connect
from tide.client import TideClient
from tide.schemas.feedback import AFFINITY_PREFER_NODE, WeightsChanged
from tide.stack.launcher import Stack
from tide.store import keys

from tests.e2e.test_job_lifecycle import pod_log
from tests.helpers import PY

# A pod that "allocates" 8 GiB, then needs NEED_MIB: below its share's limit it dies like CUDA does.
OOM_POD = """
import os, sys, time
limit = int(os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].split("=")[1].rstrip("M"))
need = int(os.environ["NEED_MIB"])
mem = os.environ.get("TIDE_SIM_GPU_MEMORY_FILE")
def use(mib):
    if mem:
        open(mem, "w").write(str(min(mib, limit) * 1024 * 1024))
use(min(need, 8192))
time.sleep(1.2)
if limit < need:
    print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need - 8192} MiB", flush=True)
    sys.exit(1)
use(need)
time.sleep(1.2)
print("done", flush=True)
"""


def share_job(name: str, need_mib: int, family: str = "oomy") -> dict:
    return {
        "metadata": {"name": name, "labels": {"family": family}},
        "spec": {"template": {"command": [PY, "-c", OOM_POD], "env": {"NEED_MIB": str(need_mib)},
                              "resources": {"gpuShare": {"memoryMiB": 10240, "smPercent": 30}}}},
    }


async def api(client: TideClient, family: str) -> dict[str, Any]:
    reply = await client.nc.request(subjects.API_WEIGHTS, json.dumps({"family": family}).encode(), timeout=5)
    return json.loads(reply.data)


async def weights(client: TideClient, family: str) -> dict[str, Any] | None:
    found = (await api(client, family))["families"]
    return found[0] if found else None


async def until(fn: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def test_oom_family_is_resubmitted_with_a_larger_share_then_decays(fast_stack: Stack,
                                                                        fast_client: TideClient) -> None:
    client, info = fast_client, fast_stack.info
    assert info is not None
    placer_nc = await connect(info.settings_for("placer"), "test-placer-weights")  # the placer's view
    published: list[WeightsChanged] = []

    async def on_weights(msg) -> None:
        published.append(WeightsChanged.model_validate_json(msg.data))

    await placer_nc.subscribe(subjects.PLACER_WEIGHTS, cb=on_weights)
    redis = Redis.from_url(info.redis_url("placer"), decode_responses=True)
    try:
        assert (await client.submit(share_job("oomy", 11264), job_id="oomy-1")).accepted
        first = await client.wait("oomy-1", timeout_s=60)
        assert first["state"] == "failed" and "OOM" in first["reason"], first

        # resubmitted under a deterministic id with a 1.5x share, and now it fits
        second = await client.wait("oomy-1-r1", timeout_s=60)
        assert second["state"] == "succeeded", second
        record = json.loads(await redis.get(keys.job("oomy-1-r1")))
        assert record["spec"]["spec"]["template"]["resources"]["gpuShare"]["memoryMiB"] == 15360
        [pod] = second["pods"]
        limit = pod_log(fast_stack, pod["node"], "oomy-1-r1", pod["name"])
        assert "done" in limit

        # the change: persisted, published, served to the CLI, with its evidence
        w = await until(lambda: weights(client, "oomy"), "weights of oomy")
        assert w["memory_multiplier"] == 1.5
        stored = json.loads(await redis.hget(keys.WEIGHTS, "oomy"))
        assert stored["memory_multiplier"] == 1.5
        raised = published[0].weights
        assert raised.family == "oomy" and raised.memory_multiplier == 1.5 and raised.clean_runs == 0
        for evidence in (raised.evidence, (await api(client, "oomy"))["history"][-1]["evidence"]):
            assert "job oomy-1 OOM, request 10.0 GiB, peak 8.0 GiB, device 79.6 GiB" in evidence, evidence
            assert "memory multiplier 1 -> 1.5" in evidence
        cli = subprocess.run([str(Path(sys.executable).parent / "tide"), "--home", str(fast_stack.home), "status",
                              "oomy-1-r1", "--json"], capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if not k.startswith("TIDE_")})
        shown = json.loads(cli.stdout)["feedback"]  # `tide status JOB` shows the family's weights
        assert shown["family"] == "oomy" and shown["memory_multiplier"] == 1.5 and shown["evidence"]
        w = await until(lambda: _clean(client, "oomy", 1), "first clean run")
        assert w["memory_multiplier"] == 1.5  # one clean run: no decay yet

        # a second clean run of the family: the multiplier starts to decay (slowly)
        assert (await client.submit(share_job("oomy", 9216), job_id="oomy-2")).accepted
        assert (await client.wait("oomy-2", timeout_s=60))["state"] == "succeeded"
        w = await until(lambda: _clean(client, "oomy", 2), "second clean run")
        assert 1.0 < w["memory_multiplier"] < 1.5, w
        assert "2 clean run(s)" in w["evidence"]
        assert not await redis.exists(keys.job("oomy-2-r1"))  # no resubmission of a success
    finally:
        await redis.aclose()
        await placer_nc.close()


async def _clean(client: TideClient, family: str, runs: int) -> dict[str, Any] | None:
    w = await weights(client, family)
    return w if w and w["clean_runs"] >= runs else None


def gang(name: str, seconds: float = 2.5) -> dict:
    return {
        "metadata": {"name": name, "labels": {"family": "chatty"}},
        "spec": {"replicas": 2, "minMember": 2,
                 "template": {"command": [PY, "-c", f"import time; time.sleep({seconds})"],
                              "resources": {"gpu": 2}}},
    }


def blocker(name: str) -> dict:
    return {"metadata": {"name": name},
            "spec": {"template": {"command": [PY, "-c", "import time; time.sleep(300)"], "resources": {"gpu": 6}}}}


async def test_heavy_cross_node_traffic_raises_affinity_and_next_run_is_on_one_node(
    fast_stack: Stack, fast_client: TideClient
) -> None:
    client = fast_client
    for name in ("block-a", "block-b"):  # 6 of 8 GPUs taken on each node: no node holds 2 x 2 GPUs
        assert (await client.submit(blocker(name), job_id=name)).accepted
        await client.wait(name, states={"running"}, timeout_s=60)
    assert (await client.submit(gang("chatty"), job_id="chatty-1")).accepted
    run1 = await client.wait("chatty-1", timeout_s=60)
    assert run1["state"] == "succeeded"
    assert len({p["node"] for p in run1["pods"]}) == 2  # spread over both nodes

    w = await until(lambda: _affinity(client, "chatty"), "affinity of chatty")
    assert w["affinity"] >= AFFINITY_PREFER_NODE
    assert "chatty-1 on 2 nodes" in w["evidence"] and "high" in w["evidence"], w["evidence"]

    await client.cancel("block-b")
    assert (await client.wait("block-b", timeout_s=60))["state"] == "cancelled"
    assert (await client.submit(gang("chatty", 1.0), job_id="chatty-2")).accepted
    run2 = await client.wait("chatty-2", timeout_s=60)
    assert run2["state"] == "succeeded"
    assert len({p["node"] for p in run2["pods"]}) == 1  # one node fits now: the gang is on it
    await client.cancel("block-a")
    w2 = await weights(client, "chatty")
    assert w2 is not None and w2["affinity"] >= AFFINITY_PREFER_NODE  # a close run does not undo it


async def _affinity(client: TideClient, family: str) -> dict[str, Any] | None:
    w = await weights(client, family)
    return w if w and w["affinity"] > 0 else None
