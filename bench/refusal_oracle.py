"""How much of the packing bound's lead comes from refusing pods that fit? An oracle experiment.

    python bench/refusal_oracle.py --traces default,gpushare40 --seeds 42-46 --refuse 0,0.1,0.2,0.3

``bench/packing_bound.py`` bounds every policy, including one that turns away pods that fit. Its
solutions do exactly that: on default (seed 42) the pods it leaves out are all 810-milli shares, which
leave 190 milli that almost no share fills, and it places every whole-GPU pod that tide turns away for
want of CPU near the end. A work-conserving scheduler (the reference simulator, Kubernetes, Volcano,
Kueue) places every pod that fits, so it cannot take that lead.

This script replays a trace exactly as ``tide.sim.simulator.simulate`` does (same workload, shuffle,
node order and placer) up to the 100% arrived mark, but turns away each arriving share of ``--size``
milli (default 810) with probability ``--refuse`` (its own seeded stream). A refused pod counts as
arrived, as a failed pod does. Refusal 0 is the plain policy, run side by side. The policy is not
changed and nothing is tuned: the figure says how far the same placements go once some pods are left
out, which is the bound's freedom and not a scheduler's.

Prints one JSON document (every run, and per trace and refusal the mean allocation, the mean gain over
refusal 0 and the mean distance to the bound of ``bench/results/packing_bound_42-51.json``) and a
summary line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from tide.core.frag import TypicalPods
from tide.core.model import Allocation
from tide.core.placer import Placer
from tide.sim.openb import load_nodes
from tide.sim.openb_variants import load_trace
from tide.sim.simulator import arrived_at_100, simulated_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_sweep import TRACE_DIR, seeds_arg  # noqa: E402

BOUND_FILE = Path(__file__).resolve().parent / "results" / "packing_bound_42-51.json"
REFUSAL_STREAM = 2  # the refusals' random stream, apart from the workload's and the node order's


def replay(nodes: list, requests: list, policy: str, seed: int, size: int, refuse: float) -> tuple[float, int]:
    """(allocated % of GPU capacity at the 100% arrived mark, shares refused)."""
    cluster = simulated_cluster(nodes, seed)
    capacity = cluster.gpu_capacity_milli
    placer = Placer(policy, seed=seed, workload=TypicalPods.from_requests(requests))
    coin = np.random.default_rng([REFUSAL_STREAM, seed])
    refused = 0
    for req in arrived_at_100(requests, capacity, seed):
        if req.kind == "share" and req.gpu_milli == size and coin.random() < refuse:
            refused += 1
            continue
        res = placer.place(cluster, req)
        if isinstance(res, Allocation):
            cluster.allocate(res)
    return 100.0 * cluster.allocated_gpu_milli() / capacity, refused


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="default,gpushare40,gpushare60,multigpu20,multigpu30,multigpu40,cpu050,cpu100")
    ap.add_argument("--seeds", default="42-46")
    ap.add_argument("--refuse", default="0,0.1,0.2,0.3", help="refusal probabilities; 0 is the plain policy")
    ap.add_argument("--size", type=int, default=810, help="milli-GPU of the shares that may be refused")
    ap.add_argument("--policy", default="tide")
    ap.add_argument("--trace-dir", default=str(TRACE_DIR))
    args = ap.parse_args()
    refusals = [float(q) for q in args.refuse.split(",")]
    if 0.0 not in refusals:
        refusals.insert(0, 0.0)
    bounds: dict[tuple[str, int], float] = {}
    if BOUND_FILE.exists():
        bounds = {(r["trace"], r["seed"]): r["bound_pct"] for r in json.loads(BOUND_FILE.read_text())["runs"]}
    nodes = load_nodes(Path(args.trace_dir) / "openb_node_list_gpu_node.csv")
    rows: list[dict] = []
    t0 = time.perf_counter()
    for trace in args.traces.split(","):
        requests = [p.request for p in load_trace(trace, args.trace_dir)]
        for seed in seeds_arg(args.seeds):
            for q in refusals:
                alloc, refused = replay(nodes, requests, args.policy, seed, args.size, q)
                row = {"trace": trace, "seed": seed, "refuse": q, "refused": refused, "allocated_pct": round(alloc, 3)}
                if (trace, seed) in bounds:
                    row["bound_pct"] = bounds[(trace, seed)]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    summary: dict[str, dict[str, dict]] = {}
    for trace in dict.fromkeys(r["trace"] for r in rows):
        plain = {r["seed"]: r["allocated_pct"] for r in rows if r["trace"] == trace and r["refuse"] == 0.0}
        summary[trace] = {}
        for q in refusals:
            rs = [r for r in rows if r["trace"] == trace and r["refuse"] == q]
            s = {"allocated_pct": round(statistics.mean(r["allocated_pct"] for r in rs), 3),
                 "gain": round(statistics.mean(r["allocated_pct"] - plain[r["seed"]] for r in rs), 3),
                 "refused": round(statistics.mean(r["refused"] for r in rs), 1)}
            if all("bound_pct" in r for r in rs):
                s["under_bound"] = round(statistics.mean(r["bound_pct"] - r["allocated_pct"] for r in rs), 3)
            summary[trace][str(q)] = s
    doc = {"policy": args.policy, "size": args.size, "runs": rows, "summary": summary,
           "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps(doc))
    best = {t: max(s.values(), key=lambda v: v["gain"]) for t, s in summary.items()}
    print(f"refusal_oracle {args.policy} {doc['wall_s']:.0f}s | " + "; ".join(
        f"{t}: +{b['gain']:.2f} refusing {b['refused']:.0f}" + (f", {b['under_bound']:.2f} under bound"
                                                              if "under_bound" in b else "")
        for t, b in best.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
