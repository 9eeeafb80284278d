"""Where is the idle GPU when 100% of the GPU capacity has arrived, and which pods failed before then?

    python bench/frag_diagnose.py --policy tide --trace default --seed 42

Replays one openb trace exactly as ``tide.sim.simulator.simulate`` does (same workload inflation,
shuffle, node order and placer) and stops at the 100% arrived mark. Prints:

- idle milli-GPU split into: whole idle GPUs on nodes whose free CPU (or memory) is too small for any
  typical GPU pod; whole idle GPUs elsewhere; slivers (partially used GPUs) by free milli-GPU bucket;
- idle milli-GPU per GPU model and the GPU demand that failed per (restricted) model set;
- failed pods by shape: count and GPU demand, with why they failed (no GPU room anywhere, GPU room
  only on nodes without the CPU/memory, ...).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
from tide.core import placer as placer_module
from tide.core.cluster import Cluster
from tide.core.frag import TypicalPods
from tide.core.model import MILLI, Allocation, PodRequest
from tide.core.placer import Placer
from tide.core.plugins.tide_frag import TideFragScore
from tide.sim.openb import load_nodes, load_pods
from tide.sim.simulator import arrived_at_100, simulated_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_sweep import TRACE_DIR  # noqa: E402


def why_failed(cluster: Cluster, req: PodRequest) -> str:
    """Coarse reason a request did not fit."""
    allowed = cluster.gpu_exists.copy()
    if req.gpu_models:
        allowed &= np.isin(cluster.gpu_model, [cluster.model_id(m) for m in req.gpu_models if m in cluster.models])
    if req.kind == "none":
        return "cpu-only: no node with cpu+mem"
    if req.kind == "whole":
        gpu_ok = ((cluster.milli_free == MILLI) & allowed).sum(axis=1) >= req.gpu_count
    else:
        gpu_ok = ((cluster.milli_free >= req.gpu_milli) & allowed).any(axis=1)
    if not gpu_ok.any():
        if req.kind == "whole":
            most = ((cluster.milli_free == MILLI) & allowed).sum(axis=1).max()
            return f"gpu: no node with {req.gpu_count} free GPUs (most {most})"
        return "gpu: no GPU with the share free"
    return "cpu/mem: GPU room only on nodes short of cpu/mem"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="tide")
    ap.add_argument("--trace", default="default")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--weights", default="", help="plugin=weight,... passed to the placer")
    ap.add_argument("--tide", default="", help='JSON of TideFragScore arguments, e.g. \'{"model_weight": 0}\'')
    args = ap.parse_args()
    if args.tide:
        kw = json.loads(args.tide)
        placer_module.PLUGINS["tide_frag"] = lambda: TideFragScore(**kw)
    weights = {k: float(v) for k, v in (p.split("=") for p in args.weights.split(",") if p)}
    nodes = load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv")
    requests = [p.request for p in load_pods(TRACE_DIR / f"openb_pod_list_{args.trace}.csv")]
    cluster = simulated_cluster(nodes, args.seed)
    cap = cluster.gpu_capacity_milli
    typical = TypicalPods.from_requests(requests)
    placer = Placer(args.policy, weights=weights or None, seed=args.seed, workload=typical)
    arrived = 0
    failed: list[tuple[PodRequest, str, float]] = []
    for req in arrived_at_100(requests, cap, args.seed):
        res = placer.place(cluster, req)
        if isinstance(res, Allocation):
            cluster.allocate(res)
        else:
            failed.append((req, why_failed(cluster, req), 100.0 * arrived / cap))
        arrived += req.total_gpu_milli
    alloc = cluster.allocated_gpu_milli()
    idle = cluster.milli_free.sum()
    pct = 100.0 / cap
    print(f"{args.policy} {args.trace} seed {args.seed}: allocated {alloc * pct:.2f}%  idle {idle * pct:.2f}%")
    cpu_used = 1 - cluster.cpu_free.sum() / cluster.cpu_cap.sum()
    mem_used = 1 - cluster.mem_free.sum() / cluster.mem_cap.sum()
    print(f"CPU used {100 * cpu_used:.1f}%  memory used {100 * mem_used:.1f}%")

    # typical GPU pod's smallest CPU ask -> a node whose CPU is below it cannot use its GPUs
    gpu_shapes = [s for s in typical.shapes if s.gpu_count]
    min_cpu = min(s.cpu_milli for s in gpu_shapes)
    free = cluster.milli_free
    whole_idle = (free == MILLI) & cluster.gpu_exists
    n_whole = whole_idle.sum(axis=1)
    starved = cluster.cpu_free < min_cpu
    print(f"\nwhole idle GPUs: {whole_idle.sum()} ({whole_idle.sum() * MILLI * pct:.2f}%), "
          f"of them on nodes with cpu_free < {min_cpu} (smallest typical GPU pod cpu): "
          f"{n_whole[starved].sum()} ({n_whole[starved].sum() * MILLI * pct:.2f}%)")
    for lim in (2000, 4000, 8000, 16000):
        m = cluster.cpu_free < lim
        print(f"  idle milli on nodes with cpu_free < {lim}: {free[m].sum() * pct:.2f}%  "
              f"(whole GPUs {n_whole[m].sum()})")
    print("  nodes by #whole idle GPUs:", dict(sorted(collections.Counter(n_whole[n_whole > 0].tolist()).items())))
    part = (free > 0) & (free < MILLI)
    print(f"slivers: {part.sum()} GPUs, {free[part].sum() * pct:.2f}%")
    buckets = collections.Counter()
    for v in free[part].tolist():
        buckets[v] += v
    top = sorted(buckets.items(), key=lambda kv: -kv[1])[:12]
    print("  top sliver sizes (free milli: share of capacity %):",
          ", ".join(f"{k}: {v * pct:.2f}" for k, v in top))
    print("idle by model (%):", ", ".join(
        f"{m}: {free[cluster.gpu_model == i].sum() * pct:.2f} (whole {whole_idle[cluster.gpu_model == i].sum()})"
        for i, m in enumerate(cluster.models)))

    lost = sum(r.total_gpu_milli for r, _, _ in failed)
    print(f"\nfailed before 100%: {len(failed)} pods, GPU demand {lost * pct:.2f}%")
    by_reason = collections.defaultdict(lambda: [0, 0])
    for r, why, _ in failed:
        key = why.split(" (most")[0]
        by_reason[key][0] += 1
        by_reason[key][1] += r.total_gpu_milli
    for k, (n, d) in sorted(by_reason.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k}: {n} pods, {d * pct:.2f}%")
    by_shape = collections.defaultdict(lambda: [0, 0, []])
    for r, _why, at in failed:
        key = (r.kind, r.gpu_count or r.gpu_milli, r.cpu_milli, r.gpu_models)
        by_shape[key][0] += 1
        by_shape[key][1] += r.total_gpu_milli
        by_shape[key][2].append(at)
    print("  by shape (kind, gpus|milli, cpu, models): pods, GPU %, first failure at arrived %")
    for k, (n, d, at) in sorted(by_shape.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"    {k}: {n}, {d * pct:.2f}%, {min(at):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
