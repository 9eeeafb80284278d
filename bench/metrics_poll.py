"""The metrics service's poll (``MetricsService._poll``) on a 1,000-node cluster, as the end-to-end benchmark's
400 jobs/s leaves it: 8 x H100 nodes, ``--busy`` of them running 1-GPU jobs (one claim, one job record each), the
others idle.

Each round changes the used hash of ``--churn`` busy nodes (a GPU taken or given back, as 5 s of 400 jobs/s do),
then polls; it reports the poll's CPU time (this process: the service's own work, the Redis replies' parsing
included) and wall time, the first (cold) poll apart, with the services' garbage collector settings
(``tide.runtime``). Starts its own Redis-compatible server on a free port. Run it
on two trees side by side (``PYTHONPATH``) to compare them; the idle poll (``--churn 0``) is each tree's floor.

    .venv/bin/python bench/metrics_poll.py --json [--nodes 1000] [--busy 200] [--churn 100] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import tempfile
import time

from opentelemetry.sdk.metrics import MeterProvider
from tide.runtime import GC_THRESHOLDS, freeze_long_lived
from tide.schemas.events import JobRecord, PodRecord
from tide.schemas.job import JobSpec
from tide.schemas.node import default_h100_node
from tide.settings import Settings
from tide.stack.servers import free_port, redis_server_binary, wait_tcp
from tide.store import keys
from tide.store.claims import ClaimStore
from tide.store.redis import connect_redis
from tide_metrics.service import MetricsService

SPEC = JobSpec.model_validate({"metadata": {"name": "bench"}, "spec": {"template": {
    "command": ["sleep", "2"], "resources": {"gpu": 1, "cpuMilli": 1000}}}})


async def fill(svc: MetricsService, nodes: int, busy: int) -> list[str]:
    """Register ``nodes`` nodes; give each of the first ``busy`` one to eight 1-GPU jobs (claim + record)."""
    claims = ClaimStore(svc.redis)
    node_ids = [f"n{i:04d}" for i in range(nodes)]
    for n in node_ids:
        await claims.set_capacity(default_h100_node(n))
    rng = random.Random(7)
    async with svc.redis.pipeline(transaction=False) as pipe:
        for n in node_ids[:busy]:
            for gpu in range(rng.randint(1, 8)):
                job_id = f"{n}-j{gpu}"
                record = JobRecord(job_id=job_id, spec=SPEC, submitted_at=0.0, updated_at=0.0,
                                   pods=[PodRecord(name=f"{job_id}-0", index=0)])
                alloc = {"node_id": n, "gpu_indices": [gpu], "gpu_milli": [1000], "gpu_mem_mib": [81920],
                         "cpu_milli": 1000, "memory_mib": 1024, "mig": None}
                pipe.set(keys.job(job_id), record.to_json())
                pipe.hset(keys.claim(job_id, f"{job_id}-0"), mapping={"alloc": json.dumps(alloc)})
                pipe.sadd(keys.CLAIMS_INDEX, keys.claim(job_id, f"{job_id}-0"))
                pipe.hset(keys.used(n), mapping={f"g{gpu}.milli": 1000, f"g{gpu}.mem": 81920})
            # the fields a claim ever touched stay (at 0): a MIG-capable GPU's slots among them
            pipe.hset(keys.used(n), mapping={f"g{g}.slot{s}": 0 for g in range(8) for s in range(8)})
        await pipe.execute()
    return node_ids[:busy]


async def measure(nodes: int, busy: int, churn: int, rounds: int) -> dict:
    gc.set_threshold(*GC_THRESHOLDS)  # the services' collector settings (tide.runtime)
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", data,
                                   "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_tcp("127.0.0.1", port)
            url = f"redis://127.0.0.1:{port}"
            svc = MetricsService(Settings(redis_url=url))
            svc.redis = connect_redis(url)
            svc._instruments(MeterProvider().get_meter("bench"))  # its counters, with no exporter
            busy_nodes = await fill(svc, nodes, busy)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await svc._poll()
            cold = (time.process_time() - cpu0, time.perf_counter() - wall0)
            freeze_long_lived()  # as the service does once started (its first poll included)
            rng = random.Random(11)
            cpu: list[float] = []
            wall: list[float] = []
            for r in range(rounds):
                for n in rng.sample(busy_nodes, min(churn, len(busy_nodes))):
                    await svc.redis.hset(keys.used(n), f"g{rng.randrange(8)}.milli", 1000 * (r % 2))
                cpu0, wall0 = time.process_time(), time.perf_counter()
                await svc._poll()
                cpu.append(time.process_time() - cpu0)
                wall.append(time.perf_counter() - wall0)
            await svc.redis.aclose()
        finally:
            server.terminate()
            server.wait(timeout=10)
    return {"nodes": nodes, "busy": busy, "churn": churn, "rounds": rounds,
            "cold_poll_cpu_ms": round(cold[0] * 1000, 1), "cold_poll_wall_ms": round(cold[1] * 1000, 1),
            "poll_cpu_ms_mean": round(statistics.mean(cpu) * 1000, 1),
            "poll_cpu_ms_median": round(statistics.median(cpu) * 1000, 1),
            "poll_wall_ms_mean": round(statistics.mean(wall) * 1000, 1)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--busy", type=int, default=200)
    parser.add_argument("--churn", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    result = await measure(args.nodes, args.busy, args.churn, args.rounds)
    if args.json:
        print(json.dumps({"benchmark": "metrics_poll", "machine": f"{os.cpu_count()} CPUs", **result}, indent=2))
    print(f"metrics_poll on {result['nodes']} nodes ({result['busy']} busy, {result['churn']} changed per poll): "
          f"{result['poll_cpu_ms_mean']} ms CPU per poll (median {result['poll_cpu_ms_median']}), "
          f"{result['poll_wall_ms_mean']} ms wall; cold {result['cold_poll_cpu_ms']} ms CPU")


if __name__ == "__main__":
    asyncio.run(main())
