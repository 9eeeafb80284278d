"""A crash or restart of a service loses no job."""

from __future__ import annotations

import asyncio
import json
import signal

from tide import subjects
from tide.client import TideClient
from tide.stack.launcher import Stack

from tests.helpers import job, py


async def test_placer_restart_while_jobs_are_queued_loses_none(stack: Stack, client: TideClient) -> None:
    stack.kill("placer", signal.SIGKILL)
    ids = [f"queued-{i}" for i in range(6)]
    for job_id in ids:
        result = await client.submit(job("queued", py("pass"), gpu=2), job_id=job_id)
        assert result.accepted
    for job_id in ids:
        assert (await client.job(job_id))["state"] == "pending"
    stack.restart("placer")
    for job_id in ids:
        assert (await client.wait(job_id, timeout_s=60))["state"] == "succeeded"


async def test_queue_restart_keeps_submissions_published_while_it_was_down(stack: Stack, client: TideClient) -> None:
    stack.kill("queue", signal.SIGKILL)
    ids = [f"while-down-{i}" for i in range(4)]
    for job_id in ids:
        body = {"schema_version": 1, "job_id": job_id, "spec": job("down", py("pass"), gpu=1)}
        await client.js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode())
    stack.restart("queue")
    for job_id in ids:
        assert (await client.wait(job_id, timeout_s=60))["state"] == "succeeded"


async def test_placer_killed_with_running_job_finishes_it_after_restart(stack: Stack, client: TideClient) -> None:
    result = await client.submit(job("long", py("import time; time.sleep(2)"), gpu=8), job_id="survivor")
    assert result.accepted
    await client.wait("survivor", states={"running"}, timeout_s=60)
    stack.kill("placer", signal.SIGKILL)
    stack.restart("placer")  # the pod's exit waits in the NODE stream for the new placer
    assert (await client.wait("survivor", timeout_s=60))["state"] == "succeeded"
    assert sum(n["gpus_used_milli"] for n in await client.nodes()) == 0


async def test_services_reconnect_after_nats_and_redis_restart(stack: Stack, client: TideClient) -> None:
    assert (await client.submit(job("before", py("pass"), gpu=1), job_id="before")).accepted
    assert (await client.wait("before", timeout_s=60))["state"] == "succeeded"
    await client.close()
    stack.kill("redis", signal.SIGTERM)  # appendonly: the data comes back with it
    stack.restart("redis")
    stack.kill("nats", signal.SIGTERM)  # JetStream keeps streams and durable consumers on disk
    stack.restart("nats")
    fresh = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        for _ in range(100):  # the services and agents find their way back on their own
            try:
                if len(await fresh.nodes()) == 2:
                    break
            except Exception:
                pass
            await asyncio.sleep(0.2)
        body = await fresh.status("before")
        assert body["jobs"] and body["jobs"][0]["state"] == "succeeded", body
        assert (await fresh.submit(job("after", py("pass"), gpu=1), job_id="after", timeout_s=30)).accepted
        assert (await fresh.wait("after", timeout_s=60))["state"] == "succeeded"
    finally:
        await fresh.close()
