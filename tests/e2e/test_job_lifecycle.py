"""Jobs through the real services: queue -> placer -> node agent -> back, on real NATS and Redis."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from tide import subjects
from tide.client import TideClient
from tide.schemas.events import JobEvent
from tide.stack.launcher import Stack

from tests.helpers import job, py

ENV_DUMP = (
    "import os, json; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('CUDA_', 'TIDE_'))}))"
)


async def collect_kinds(client: TideClient, job_id: str, until: str, timeout_s: float = 60) -> list[str]:
    kinds: list[str] = []
    done = asyncio.Event()

    async def on(msg) -> None:
        e = JobEvent.model_validate_json(msg.data)
        kinds.append(e.kind)
        if e.kind == until:
            done.set()

    sub = await client.nc.subscribe(subjects.job_events(job_id), cb=on)
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        await sub.unsubscribe()
    return kinds


def pod_log(stack: Stack, node: str, job_id: str, pod: str) -> str:
    """The pod's output (the agent names the log after the pod and its placement attempt)."""
    [log] = (Path(stack.home) / "agents" / node / job_id).glob(f"{pod}.a*.log")
    return log.read_text()


async def run_to_success(client: TideClient, spec: dict, job_id: str) -> tuple[list[str], dict]:
    watcher = asyncio.create_task(collect_kinds(client, job_id, "succeeded"))
    await asyncio.sleep(0.05)
    result = await client.submit(spec, job_id=job_id)
    assert result.accepted, result
    kinds = await watcher
    return kinds, await client.job(job_id)


def assert_lifecycle(kinds: list[str]) -> None:
    order = ["queued", "placed", "running", "succeeded"]
    positions = [kinds.index(k) for k in order]
    assert positions == sorted(positions), kinds


async def test_single_gpu_job_runs_with_its_gpu(stack: Stack, client: TideClient) -> None:
    kinds, status = await run_to_success(client, job("one", py(ENV_DUMP), gpu=1), "one-gpu")
    assert_lifecycle(kinds)
    assert status["state"] == "succeeded"
    [pod] = status["pods"]
    assert pod["state"] == "succeeded" and len(pod["gpus"]) == 1
    env = json.loads(pod_log(stack, pod["node"], "one-gpu", pod["name"]))
    assert env["CUDA_VISIBLE_DEVICES"] == pod["gpus"][0]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


async def test_shared_gpu_job_gets_mps_limits(stack: Stack, client: TideClient) -> None:
    spec = job("share", py(ENV_DUMP), gpuShare={"memoryMiB": 10240, "smPercent": 30})
    kinds, status = await run_to_success(client, spec, "share-gpu")
    assert_lifecycle(kinds)
    [pod] = status["pods"]
    env = json.loads(pod_log(stack, pod["node"], "share-gpu", pod["name"]))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert env["CUDA_VISIBLE_DEVICES"] == pod["gpus"][0]


async def test_four_pod_job_runs_every_pod_on_distinct_gpus(stack: Stack, client: TideClient) -> None:
    spec = job("gang", py(ENV_DUMP), replicas=4, gpu=2)
    kinds, status = await run_to_success(client, spec, "four-pods")
    assert_lifecycle(kinds)
    assert kinds.count("pod-started") == 4
    pods = status["pods"]
    assert [p["state"] for p in pods] == ["succeeded"] * 4
    all_gpus = [(p["node"], g) for p in pods for g in p["gpus"]]
    assert len(all_gpus) == 8 and len(set(all_gpus)) == 8
    world = {json.loads(pod_log(stack, p["node"], "four-pods", p["name"]))["TIDE_WORLD_SIZE"] for p in pods}
    assert world == {"4"}


async def test_failing_command_fails_with_exit_code(client: TideClient) -> None:
    res = await client.submit(job("fail", py("import sys; sys.exit(3)"), gpu=1), job_id="fails")
    assert res.accepted
    status = await client.wait("fails", timeout_s=60)
    assert status["state"] == "failed"
    assert "exited with code 3" in status["reason"]
    assert status["pods"][0]["exit_code"] == 3
    nodes = await client.nodes()
    assert sum(n["gpus_used_milli"] for n in nodes) == 0


async def test_cancel_stops_running_job_and_frees_gpus(stack: Stack, client: TideClient, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    res = await client.submit(job("sleeper", py(code), gpu=4), job_id="sleeper")
    assert res.accepted
    await client.wait("sleeper", states={"running"}, timeout_s=60)
    nodes = await client.nodes()
    assert sum(n["gpus_used_milli"] for n in nodes) == 4000
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text():
            break
        await asyncio.sleep(0.05)
    await client.cancel("sleeper")
    status = await client.wait("sleeper", timeout_s=60)
    assert status["state"] == "cancelled"
    assert status["pods"][0]["state"] == "stopped"
    nodes = await client.nodes()
    assert sum(n["gpus_used_milli"] for n in nodes) == 0
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the pod's process is still alive after cancel")


async def test_cancel_pending_job(stack: Stack, client: TideClient) -> None:
    blocker = await client.submit(job("big", py("import time; time.sleep(300)"), replicas=2, gpu=8), job_id="big")
    assert blocker.accepted
    await client.wait("big", states={"running"}, timeout_s=60)
    waiting = await client.submit(job("waits", py("pass"), gpu=1), job_id="waits")
    assert waiting.accepted
    await asyncio.sleep(1.5)
    assert (await client.job("waits"))["state"] == "pending"
    await client.cancel("waits")
    assert (await client.wait("waits", timeout_s=30))["state"] == "cancelled"
    await client.cancel("big")
    assert (await client.wait("big", timeout_s=60))["state"] == "cancelled"


async def test_job_waits_for_capacity_then_runs(client: TideClient) -> None:
    first = await client.submit(job("first", py("import time; time.sleep(2)"), replicas=2, gpu=8), job_id="first")
    second = await client.submit(job("second", py("pass"), replicas=2, gpu=8), job_id="second")
    assert first.accepted and second.accepted
    await client.wait("first", states={"running"}, timeout_s=60)
    assert (await client.job("second"))["state"] == "pending"
    assert (await client.wait("second", timeout_s=60))["state"] == "succeeded"
    first_done = (await client.job("first"))["finished_at"]
    second_started = (await client.job("second"))["started_at"]
    assert second_started >= first_done


async def test_a_jobs_path_is_traceable_by_its_id_in_every_services_json_logs(stack: Stack, client: TideClient) -> None:
    await run_to_success(client, job("traced", py("pass"), gpu=1), "traced-job")
    seen: dict[str, set[str]] = {}
    for log_file in (Path(stack.home) / "logs").glob("*.log"):
        for line in log_file.read_text().splitlines():
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            if entry.get("job_id") == "traced-job":
                seen.setdefault(entry["service"], set()).add(entry["event"])
    assert "job_queued" in seen["queue"]
    assert {"job_reserved", "gang_committed", "job_running", "job_finished"} <= seen["placer"]
    assert {"pod_started", "pod_exited"} <= seen["node-agent"]


async def test_placer_applies_the_familys_memory_multiplier_from_redis(stack: Stack, client: TideClient) -> None:
    from redis.asyncio import Redis
    from tide.schemas.feedback import FamilyWeights
    from tide.store import keys

    redis = Redis.from_url(stack.info.redis_url("placer"), decode_responses=True)
    try:
        weights = FamilyWeights(family="hungry", memory_multiplier=2.0, evidence="test")
        await redis.hset(keys.WEIGHTS, "hungry", weights.model_dump_json())
    finally:
        await redis.aclose()
    spec = job("hungry", py(ENV_DUMP), gpuShare={"memoryMiB": 10240, "smPercent": 30})
    spec["metadata"]["labels"] = {"family": "hungry"}
    _, status = await run_to_success(client, spec, "hungry-1")
    [pod] = status["pods"]
    env = json.loads(pod_log(stack, pod["node"], "hungry-1", pod["name"]))
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
