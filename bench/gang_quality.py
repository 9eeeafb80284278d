"""Gang placement quality: the solver's communication cost against the exhaustive optimum.

Random small topologies (1-4 racks x 2-4 nodes x 8 GPUs, NVSwitch or PCIe-only nodes), random
load already on them, random gang sizes of 1-GPU or 2-GPU pods. Prints JSON and a one-line summary.

    .venv/bin/python bench/gang_quality.py [--cases 200] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from tide.core import Cluster, PodRequest
from tide.core.gang import place_gang
from tide.core.gang_optimum import optimum_cost
from tide.core.model import MILLI, Allocation
from tide.schemas.node import GpuDescription, NodeDescription


def random_cluster(rng: random.Random) -> Cluster:
    nodes = []
    for r in range(rng.randint(1, 4)):
        for i in range(rng.randint(2, 4)):
            nvswitch = rng.random() < 0.5
            gpus = [GpuDescription(index=g, model="A100-80GB", memory_mib=81920, pcie_switch=g // 2, numa_node=g // 4,
                                   nvlink_domain=0 if nvswitch else None) for g in range(8)]
            nodes.append(NodeDescription(node_id=f"r{r}n{i}", cpu_milli=128_000, memory_mib=1 << 20, rack=f"r{r}",
                                         spine="s0" if r < 2 else "s1", gpus=gpus))
    cluster = Cluster.from_descriptions(nodes)
    for nd in nodes:  # random load: some GPUs already taken
        busy = [g for g in range(8) if rng.random() < 0.35]
        if busy:
            cluster.allocate(Allocation(node_id=nd.node_id, gpu_indices=tuple(busy), gpu_milli=(MILLI,) * len(busy),
                                        gpu_mem_mib=(81920,) * len(busy)))
    return cluster


def run(cases: int, seed: int) -> dict:
    rng = random.Random(seed)
    ratios = []
    skipped = 0
    while len(ratios) < cases:
        cluster = random_cluster(rng)
        req = PodRequest(gpu_count=rng.choice([1, 1, 2]), cpu_milli=1000, memory_mib=1024)
        n = rng.randint(2, 10)
        best = optimum_cost(cluster, req, n)
        plan = place_gang(cluster, req, n)
        if best is None:
            assert not hasattr(plan, "cost"), "solver placed a gang the exhaustive search says cannot fit"
            skipped += 1
            continue
        assert hasattr(plan, "cost"), f"solver found no plan where the optimum is {best}"
        ratio = plan.cost / best if best else 1.0
        if not ratios or ratio > max(ratios):
            worst = {"pods": n, "gpus_per_pod": req.gpu_count, "cost": plan.cost, "optimum": best,
                     "plan": sorted({a.node_id: sum(1 for b in plan.allocations if b.node_id == a.node_id)
                                     for a in plan.allocations}.items()),
                     "free_gpus": {nid: int((cluster.milli_free[i] == MILLI).sum())
                                   for nid, i in cluster.index.items()},
                     "nvswitch": [nid for nid, i in cluster.index.items() if cluster.nvlink[i][0] >= 0]}
        ratios.append(ratio)
    return {
        "bench": "gang_quality",
        "cases": cases,
        "seed": seed,
        "infeasible_skipped": skipped,
        "mean_ratio": round(statistics.mean(ratios), 4),
        "worst_ratio": round(max(ratios), 4),
        "optimal_share": round(sum(r <= 1.0 + 1e-9 for r in ratios) / len(ratios), 3),
        "worst_case": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    result = run(args.cases, args.seed)
    print(json.dumps(result, indent=2))
    print(f"gang_quality: {result['cases']} cases, cost / optimum mean {result['mean_ratio']}, "
          f"worst {result['worst_ratio']}, optimal in {result['optimal_share'] * 100:.0f}%")


if __name__ == "__main__":
    main()
