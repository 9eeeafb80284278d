"""High availability on the loopback (docs/ha.md): kill -9 a NATS server or the Redis primary under load;
no job is lost, new jobs are placed and finish, the accounting stays consistent. Real servers, no mocks."""

from __future__ import annotations

import asyncio
import signal
import time

from tide import subjects
from tide.client import TideClient
from tide.stack.launcher import Stack
from tide.store import keys
from tide.store.redis import connect_redis, redis_for

from tests.ha.conftest import nats_process, record, redis_master_port, retry, server_of_client
from tests.helpers import job, py

RUN_S = 3  # long enough to be running across the failover


async def submit_all(client: TideClient, prefix: str, count: int, seconds: float, timeout_s: float = 30) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(count)]
    for job_id in ids:
        spec = job(prefix, py(f"import time; time.sleep({seconds})"), gpu=1)
        result = await retry(lambda spec=spec, job_id=job_id: client.submit(spec, job_id=job_id, timeout_s=10),
                             timeout_s, f"submit {job_id}")
        assert result.accepted, result
    return ids


async def wait_all(client: TideClient, ids: list[str], state: str = "succeeded", timeout_s: float = 45) -> None:
    states = {"running", "succeeded"} if state == "running" else None
    for job_id in ids:
        final = await client.wait(job_id, states=states, timeout_s=timeout_s)
        assert final["state"] in ({"running", "succeeded"} if state == "running" else {state}), final


async def test_streams_have_three_replicas(ha_stack: Stack, ha_client: TideClient) -> None:
    for sd in subjects.STREAMS:
        info = await ha_client.js.stream_info(sd.name)
        assert info.config.num_replicas == 3, sd.name
        assert info.cluster is not None and info.cluster.leader
        assert len(info.cluster.replicas or []) == 2, info.cluster  # the leader and two followers
    # the durable consumers inherit the stream's replicas
    consumer = await ha_client.js.consumer_info(subjects.QUEUE_INTAKE.stream, subjects.QUEUE_INTAKE.durable)
    assert consumer.cluster is not None and len(consumer.cluster.replicas or []) == 2


async def test_kill_nats_server_of_the_queue_loses_no_job(ha_stack: Stack, ha_client: TideClient) -> None:
    before = await submit_all(ha_client, "before-nats", 6, RUN_S)
    await wait_all(ha_client, before, "running")
    victim = server_of_client(ha_stack, "tide-queue")
    jobs_leader = nats_process((await ha_client.js.stream_info("JOBS")).cluster.leader)  # type: ignore[union-attr]
    print(f"\nkilling {victim} (the queue's server; JOBS stream leader: {jobs_leader})")
    t0 = time.monotonic()
    ha_stack.kill(victim, signal.SIGKILL)

    after = await submit_all(ha_client, "after-nats", 1, 0)
    record("nats_kill_to_submit_accepted", time.monotonic() - t0)
    await wait_all(ha_client, after)
    record("nats_kill_to_new_job_succeeded", time.monotonic() - t0)

    more = await submit_all(ha_client, "more-nats", 3, 0)
    await wait_all(ha_client, [*before, *more])  # every job, old and new, to success: none lost
    status = await ha_client.status(limit=100)
    assert {j["job_id"] for j in status["jobs"]} >= {*before, *after, *more}
    assert server_of_client(ha_stack, "tide-queue") != victim
    nodes = await retry(ha_client.nodes, 10, "nodes")
    assert len(nodes) == 2 and sum(n["gpus_used_milli"] for n in nodes) == 0
    info = await ha_client.js.stream_info("JOBS")
    assert info.config.num_replicas == 3
    assert info.cluster is not None and nats_process(info.cluster.leader or "tide-0") != victim


async def test_kill_redis_primary_sentinel_promotes_and_services_follow(ha_stack: Stack, ha_client: TideClient) -> None:
    info = ha_stack.info
    assert info is not None
    before = await submit_all(ha_client, "before-redis", 4, RUN_S)
    await wait_all(ha_client, before, "running")
    assert redis_master_port(ha_stack) == info.ports["redis"]
    t0 = time.monotonic()
    ha_stack.kill("redis", signal.SIGKILL)
    while redis_master_port(ha_stack) != info.ports["redis-replica"]:
        assert time.monotonic() - t0 < 30, "no Sentinel promoted the replica"
        await asyncio.sleep(0.05)
    record("redis_kill_to_replica_promoted", time.monotonic() - t0)

    after = await submit_all(ha_client, "after-redis", 1, 0)
    record("redis_kill_to_submit_accepted", time.monotonic() - t0)
    await wait_all(ha_client, after)
    record("redis_kill_to_new_job_succeeded", time.monotonic() - t0)

    # running jobs placed after the failover: the claims in the new primary are exactly their pods
    running = await submit_all(ha_client, "running-redis", 3, RUN_S)
    await wait_all(ha_client, running, "running")
    redis = redis_for(info.settings_for("queue"))
    try:
        pods: set[str] = set()
        for job_id in running:
            summary = await ha_client.job(job_id)
            assert summary is not None
            if summary["state"] == "running":
                pods |= {keys.claim(job_id, p["name"]) for p in summary["pods"] if p["state"] == "running"}
        claims = set(await redis.smembers(keys.CLAIMS_INDEX))
        assert pods <= claims, (pods, claims)
        assert all(c.split(":")[2] in {*before, *running} for c in claims), claims  # none left from elsewhere

        await wait_all(ha_client, [*before, *after, *running])  # every job to success, none lost
        assert await redis.smembers(keys.CLAIMS_INDEX) == set()
        for node_id in info.node_ids:
            used = await redis.hgetall(keys.used(node_id))
            assert all(int(float(v)) == 0 for v in used.values()), (node_id, used)
        nodes = await retry(ha_client.nodes, 10, "nodes")
        assert sum(n["gpus_used_milli"] for n in nodes) == 0
        assert await redis.set(f"{keys.PREFIX}:ha-probe", "written")  # a write: the client is on a master
        assert int((await redis.connection_pool.get_master_address())[1]) == info.ports["redis-replica"]
        # the Sentinel-managed pool blocks like the plain one: 300 commands on 4 connections, none fails
        settings = info.settings_for("queue")
        small = connect_redis(settings.redis_url, pool_size=4, sentinels=settings.redis_sentinels,
                              master_name=settings.redis_master_name,
                              sentinel_password=settings.redis_sentinel_password)
        try:
            results = await asyncio.gather(*[small.incr(f"{keys.PREFIX}:ha-burst") for _ in range(300)])
            assert sorted(results) == list(range(1, 301))
        finally:
            await small.aclose()
    finally:
        await redis.aclose()
