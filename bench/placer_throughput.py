"""Placement decisions per second on synthetic clusters (one core); prints JSON and a summary line.

    python bench/placer_throughput.py [--policy tide] [--baseline fgd] [--sizes 1000,10000] [--decisions 2000]
        [--repeat 3] [--live]

Each repeat starts from an empty cluster and a new placer (so the score cache starts cold) and places
``--decisions`` pods one by one, applying each allocation. ``decisions_per_s`` is the best wall-clock
rate over the repeats; ``decisions_per_cpu_s`` the best rate in this process's CPU time, which is the
figure to read on a shared machine (the wall clock then includes time spent waiting for a core).

The ``--baseline`` policy (FGD by default) is measured in the same run, its repeats alternating with
the policy's, and ``ratio_to_baseline`` is the policy's CPU-time rate over the baseline's: a slow day of
the machine moves both rates, not the ratio (``--baseline ''`` measures the policy alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from tide.core import DEFAULT_POLICY, Allocation, Cluster, Placer, PodRequest, TypicalPods
from tide.schemas.node import GpuDescription, NodeDescription

MODELS = [("A100-80GB", 8, 81920, True), ("H100-80GB", 8, 81559, True), ("T4", 4, 15109, False),
          ("V100M32", 8, 32510, False)]


def synthetic_nodes(n: int, seed: int = 0) -> list[NodeDescription]:
    rng = np.random.default_rng(seed)
    nodes = []
    for i in range(n):
        model, count, mem, mig = MODELS[int(rng.integers(len(MODELS)))]
        gpus = [GpuDescription(index=g, model=model, memory_mib=mem, mig_capable=mig, pcie_switch=g // 2,
                               numa_node=g // (count // 2), nvlink_domain=0 if count == 8 else None)
                for g in range(count)]
        nodes.append(NodeDescription(node_id=f"n{i:05d}", cpu_milli=128000, memory_mib=1 << 20,
                                     rack=f"rack-{i // 16}", spine=f"spine-{i // 256}",
                                     labels={"pool": "training" if i % 4 else "inference"}, gpus=gpus))
    return nodes


def requests(k: int, seed: int = 1) -> list[PodRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        if rng.random() < 0.5:
            out.append(PodRequest(cpu_milli=int(rng.integers(1, 16)) * 1000, memory_mib=16384, gpu_count=1))
        else:
            out.append(PodRequest(cpu_milli=int(rng.integers(1, 8)) * 1000, memory_mib=8192,
                                  gpu_milli=int(rng.choice([100, 250, 300, 500, 700])),
                                  gpu_mem_mib=int(rng.choice([0, 4096, 8192]))))
    return out


def run_once(nodes: list[NodeDescription], reqs: list[PodRequest], policy: str, live: bool) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, pods placed) of one pass from an empty cluster and a cold placer."""
    cluster = Cluster.from_descriptions(nodes)
    placer = Placer(policy, workload=None if live else TypicalPods.from_requests(reqs))
    placed = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for r in reqs:
        if live:  # as the placer service: decide on a what-if copy, learn the workload online
            res = placer.place(cluster.copy(), r)
            if isinstance(res, Allocation):
                placer.observe(r)
        else:
            res = placer.place(cluster, r)
        if isinstance(res, Allocation):
            cluster.allocate(res)
            placed += 1
    return time.perf_counter() - t0, time.process_time() - c0, placed


def bench(n_nodes: int, decisions: int, policy: str, repeat: int = 3, live: bool = False,
          baseline: str = "") -> dict:
    nodes = synthetic_nodes(n_nodes)
    reqs = requests(decisions)
    policies = [policy] + ([baseline] if baseline else [])
    runs: dict[str, list[tuple[float, float, int]]] = {p: [] for p in policies}
    for _ in range(repeat):  # alternate, so both see the same machine
        for p in policies:
            runs[p].append(run_once(nodes, reqs, p, live))

    def rates(p: str) -> dict:
        wall, cpu = min(r[0] for r in runs[p]), min(r[1] for r in runs[p])
        return {"placed": runs[p][-1][2], "seconds": round(wall, 3), "decisions_per_s": round(decisions / wall, 1),
                "decisions_per_cpu_s": round(decisions / cpu, 1)}

    row = {"nodes": n_nodes, "gpus": sum(len(n.gpus) for n in nodes), "policy": policy, "live": live,
           "decisions": decisions, "repeats": repeat, **rates(policy)}
    if baseline:
        base = rates(baseline)
        row["baseline"] = {"policy": baseline, **base}
        row["ratio_to_baseline"] = round(row["decisions_per_cpu_s"] / base["decisions_per_cpu_s"], 3)
    row["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument("--baseline", default="fgd", help="policy measured alongside in the same run ('' for none)")
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--live", action="store_true",
                    help="as the placer service: each decision on a what-if copy, typical pods learnt online")
    args = ap.parse_args()
    rows = [bench(int(n), args.decisions, args.policy, args.repeat, args.live, args.baseline)
            for n in args.sizes.split(",")]
    print(json.dumps(rows))
    print("placer_throughput " + ", ".join(
        f"{r['nodes']} nodes: {r['decisions_per_s']:.0f}/s wall, {r['decisions_per_cpu_s']:.0f}/s CPU"
        + (f" = {r['ratio_to_baseline']:.2f} x {args.baseline} ({r['baseline']['decisions_per_cpu_s']:.0f}/s CPU)"
           if args.baseline else "") for r in rows)
        + f" (policy {args.policy}, single-GPU + shared pods{', live' if args.live else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
