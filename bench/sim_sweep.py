"""Sweep policies x openb traces x seeds through the simulator; prints JSON and a summary line.

    python bench/sim_sweep.py --policies bestfit,fgd,tide --seeds 42-51 --out bench/results/sweep.json

A trace is a shipped file's name (``cpu200``) or a generated CPU-heavier variant (``cpu300-gen1``, see
``tide.sim.openb_variants``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tide.cli.sim import trace_dirs
from tide.sim.openb import load_nodes
from tide.sim.openb_variants import load_trace
from tide.sim.simulator import simulate

TRACES = ["default", "gpushare40", "gpushare60", "multigpu20", "multigpu30", "multigpu40", "gpuspec10",
          "gpuspec20", "gpuspec25", "cpu050", "cpu100", "cpu200"]
TRACE_DIR = next((d for d in trace_dirs() if d.is_dir()), trace_dirs()[-1])  # $TIDE_TRACES_DIR or beside the project


def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default="bestfit,fgd,tide")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--trace-dir", default=str(TRACE_DIR))
    ap.add_argument("--out", help="also write the JSON here (rewritten after every run)")
    args = ap.parse_args()
    nodes = load_nodes(Path(args.trace_dir) / "openb_node_list_gpu_node.csv")
    rows: list[dict] = []
    t0 = time.perf_counter()
    for trace in args.traces.split(","):
        requests = [p.request for p in load_trace(trace, args.trace_dir)]
        for policy in args.policies.split(","):
            for seed in seeds_arg(args.seeds):
                r = simulate(nodes, requests, policy, seed=seed, trace=trace)
                rows.append({"trace": trace, "policy": policy, "seed": seed,
                             "allocated_pct_at_100": round(r.allocated_pct_at_100, 3),
                             "pods_failed": r.pods_failed, "wall_s": round(r.wall_s, 2)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                if args.out:
                    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.out).write_text(json.dumps({"runs": rows, "summary": summarise(rows)}, indent=1))
    summary = summarise(rows)
    print(json.dumps({"runs": rows, "summary": summary}))
    parts = [f"{t}: " + "/".join(f"{p} {v:.2f}" for p, v in pols.items()) for t, pols in summary.items()]
    print(f"sim_sweep {time.perf_counter() - t0:.0f}s mean allocated@100 | " + "; ".join(parts))
    return 0


def summarise(rows: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        out.setdefault(r["trace"], {}).setdefault(r["policy"], []).append(r["allocated_pct_at_100"])
    return {t: {p: round(statistics.mean(v), 2) for p, v in pols.items()} for t, pols in out.items()}


if __name__ == "__main__":
    sys.exit(main())
