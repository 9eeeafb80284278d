"""Issue 17: the openb simulation under different node orders and tie-breaks, side by side.

    python bench/node_order_ab.py --traces cpu200 --policies bestfit,fgd --seeds 42-51 --orders file,seeded

Orders: ``seeded`` (the simulator's, ``tide.sim.simulator.node_order``: a permutation drawn from the run's
seed, as the reference simulator does), ``file`` (the node list's order for every seed: the simulator's
behaviour before c938e36), ``filerev`` (the file's order reversed), ``filerotK`` (the file's order with its
first K nodes moved to the end) and ``permN`` (one fixed random permutation drawn with seed N, the same for
every run). ``--tie-break random`` breaks score ties uniformly at random per decision instead of taking the first
tied node. Prints one JSON line per run, then the mean per (trace, policy, order).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import tide.sim.simulator as sim
from sim_sweep import TRACE_DIR, seeds_arg  # bench/ is the script's directory
from tide.core.placer import Placer
from tide.sim.openb import load_nodes
from tide.sim.openb_variants import load_trace

SEEDED = sim.node_order


def order_fn(name: str):
    if name == "seeded":
        return SEEDED
    if name == "file":
        return lambda count, seed: np.arange(count)
    if name == "filerev":
        return lambda count, seed: np.arange(count)[::-1].copy()
    if name.startswith("filerot"):
        k = int(name.removeprefix("filerot"))
        return lambda count, seed: np.roll(np.arange(count), -k)
    if name.startswith("perm"):
        fixed = int(name.removeprefix("perm"))
        return lambda count, seed: np.random.default_rng(fixed).permutation(count)
    raise SystemExit(f"unknown order {name!r}: seeded, file, filerev, filerotK or permN")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="cpu200")
    ap.add_argument("--policies", default="bestfit,fgd")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--orders", default="file,seeded")
    ap.add_argument("--tie-break", choices=("first", "random"), default="first")
    ap.add_argument("--trace-dir", default=str(TRACE_DIR))
    args = ap.parse_args()
    sim.Placer = functools.partial(Placer, tie_break=args.tie_break)  # type: ignore[misc]
    nodes = load_nodes(Path(args.trace_dir) / "openb_node_list_gpu_node.csv")
    means: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for trace in args.traces.split(","):
        requests = [p.request for p in load_trace(trace, args.trace_dir)]
        for seed in seeds_arg(args.seeds):
            for policy in args.policies.split(","):
                for order in args.orders.split(","):
                    sim.node_order = order_fn(order)  # type: ignore[assignment]
                    r = sim.simulate(nodes, requests, policy, seed=seed, trace=trace)
                    sim.node_order = SEEDED  # type: ignore[assignment]
                    means[(trace, policy, order)].append(r.allocated_pct_at_100)
                    print(json.dumps({"trace": trace, "policy": policy, "seed": seed, "order": order,
                                      "tie_break": args.tie_break,
                                      "allocated_pct_at_100": round(r.allocated_pct_at_100, 2),
                                      "failed_by_kind": r.failed_by_kind, "wall_s": round(r.wall_s, 1)}),
                          flush=True)
    for (trace, policy, order), v in means.items():
        print(f"{trace} {policy} {order}: mean {statistics.mean(v):.2f} over {len(v)} seeds", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
