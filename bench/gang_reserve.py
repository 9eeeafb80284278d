"""Gang reserve + commit latency through Redis on a 1,000-node simulated cluster.

For gang sizes 8, 64 and 512 (1 GPU per pod): solve the placement (topology-aware gang solver),
reserve every pod's slots in one Lua call with a TTL, commit, then release; repeated. Prints JSON
and a one-line summary. Starts its own Redis-compatible server on a free port.

    .venv/bin/python bench/gang_reserve.py --json [--nodes 1000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time

from redis.asyncio import Redis
from tide.core import Cluster, PodRequest
from tide.core.gang import place_gang
from tide.core.job_placement import claim_items
from tide.schemas.node import default_h100_node
from tide.stack.servers import free_port, redis_server_binary, wait_tcp
from tide.store.claims import ClaimItem, ClaimStore, PodClaim


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(nodes: int, repeat: int, sizes: list[int]) -> dict:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        try:
            wait_tcp("127.0.0.1", port)
            redis = Redis(port=port, decode_responses=True)
            store = ClaimStore(redis)
            descs = [default_h100_node(f"n{i:04d}", rack=f"r{i // 16}") for i in range(nodes)]
            for d in descs:
                await store.set_capacity(d)
            cluster = Cluster.from_descriptions(descs)
            models = {g.index: g.model for g in descs[0].gpus}
            request = PodRequest(gpu_count=1, cpu_milli=4000, memory_mib=32768)
            results = {}
            for size in sizes:
                solve, reserve, commit, total = [], [], [], []
                for r in range(repeat):
                    t0 = time.perf_counter()
                    plan = place_gang(cluster, request, size)
                    t1 = time.perf_counter()
                    claims = [
                        PodClaim(f"g{size}-{r}", f"p{i}", tuple(ClaimItem(*it) for it in claim_items(a, models)),
                                 a.to_dict())
                        for i, a in enumerate(plan.allocations)
                    ]
                    ok, why = await store.reserve(claims, f"g{size}-{r}:1", ttl_ms=30_000)
                    t2 = time.perf_counter()
                    assert ok, why
                    assert await store.commit(f"g{size}-{r}:1")
                    t3 = time.perf_counter()
                    await store.release([c.key for c in claims])
                    solve.append((t1 - t0) * 1000)
                    reserve.append((t2 - t1) * 1000)
                    commit.append((t3 - t2) * 1000)
                    total.append((t3 - t0) * 1000)
                results[str(size)] = {
                    "solve_ms_p50": round(statistics.median(solve), 2),
                    "reserve_ms_p50": round(statistics.median(reserve), 2),
                    "reserve_ms_p99": round(pct(reserve, 0.99), 2),
                    "commit_ms_p50": round(statistics.median(commit), 2),
                    "reserve_commit_ms_p50": round(statistics.median([a + b for a, b in zip(reserve, commit,
                                                                                             strict=True)]), 2),
                    "total_ms_p50": round(statistics.median(total), 2),
                    "total_ms_p99": round(pct(total, 0.99), 2),
                    "nodes_used": len({a.node_id for a in plan.allocations}),
                }
            await redis.aclose()
            return {"bench": "gang_reserve", "nodes": nodes, "repeat": repeat, "gangs": results}
        finally:
            proc.terminate()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--sizes", default="8,64,512")
    parser.add_argument("--json", action="store_true", help="print the JSON result")
    args = parser.parse_args()
    result = asyncio.run(run(args.nodes, args.repeat, [int(s) for s in args.sizes.split(",")]))
    if args.json:
        print(json.dumps(result, indent=2))
    parts = [f"{s} pods: reserve+commit {g['reserve_commit_ms_p50']} ms, solve {g['solve_ms_p50']} ms"
             for s, g in result["gangs"].items()]
    print(f"gang_reserve on {result['nodes']} nodes (p50): " + "; ".join(parts))


if __name__ == "__main__":
    main()
