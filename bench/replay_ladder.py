"""The capability ladder: `tide sim replay` on one seeded openb workload, rung by rung, at a load level.

    nice -n 10 .venv/bin/python bench/replay_ladder.py --load 12 --out bench/results/replay_ladder_load12.json \
        --plot docs/replay_load12.png
    nice -n 10 .venv/bin/python bench/replay_ladder.py --load 20 --out bench/results/replay_ladder_load20.json \
        --plot docs/replay_load20.png

Prints the markdown table of docs/benchmarks.md ("Replay"). Same as
`tide sim replay --pods ... --policy ladder --load L --json OUT` plus the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tide.sim.replay import LADDER, replay
from tide.sim.replay_workload import WorkloadConfig, build_workload

TRACE = "/work/shared/traces/openb/openb_pod_list_default.csv"
NODES = "/work/shared/traces/openb/openb_node_list_gpu_node.csv"


def fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def row(res: dict) -> str:
    t = res["totals"]
    q = t["queueing_delay_s"]
    online = q.get("online-serving", {})
    train = q.get("offline-training", {})
    jct = t["jct_s"].get("offline-training", {})
    return (f"| {res['capabilities']['name']} | {fmt(t['gpu_alloc_pct'], 1)} | {fmt(t['gpu_alloc_saturated_pct'], 1)}"
            f" | {fmt(t['useful_gpu_h'])} | {fmt(online.get('p99'), 0)} | {fmt(train.get('p50'), 0)} /"
            f" {fmt(train.get('p95'), 0)} / {fmt(train.get('p99'), 0)} | {fmt((jct.get('p50') or 0) / 3600, 2)}"
            f" | {fmt(t['gang_wait_s']['p95'], 0)} | {t['preemptions']} / {fmt(t['preempted_gpu_h_lost'], 1)}"
            f" | {t['oom_kills']} | {fmt(t['idle_held_gpu_h'], 1)} | {fmt(t['frag_pct_mean'], 1)}"
            f" | {t['completed']} | {t['pending_at_end']} |")


HEADER = ("| rung | GPU alloc % | alloc % (saturated) | useful GPU-h | online p99 wait (s)"
          " | training wait p50/p95/p99 (s) | training JCT p50 (h) | gang wait p95 (s) | preemptions / GPU-h lost"
          " | OOM kills | GPU-h held idle (gang-off) | frag % | jobs done | pending at end |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", default=TRACE)
    ap.add_argument("--nodes", default=NODES)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--load", type=float, default=20.0)
    ap.add_argument("--speedup", type=float, default=50.0)
    ap.add_argument("--slice", type=int, default=40)
    ap.add_argument("--tick", type=float, default=30.0)
    ap.add_argument("--rungs", default="", help="comma-separated rung numbers (default: all)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--merge", nargs="+", help="do not run: merge these result files (in rung order) into --out")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    if args.merge:
        merged = [r for f in args.merge for r in json.loads(Path(f).read_text())]
        names = [c.name for c in LADDER]
        merged.sort(key=lambda r: names.index(r["capabilities"]["name"]))
        Path(args.out).write_text(json.dumps(merged))
        print(HEADER)
        for res in merged:
            print(row(res))
        if args.plot:
            from tide.sim.replay_plot import plot_replay

            w = merged[0]["workload"]
            plot_replay(merged, args.plot, title=f"openb default, {w['gpus']} GPUs, load {w['load']:g}, "
                                                 f"speedup {w['speedup']:g}, seed {w['seed']}")
        return 0
    config = WorkloadConfig(seed=args.seed, nodes=args.slice, speedup=args.speedup, load=args.load)
    workload = build_workload(args.nodes, args.pods, config)
    rungs = [LADDER[int(k)] for k in args.rungs.split(",")] if args.rungs else list(LADDER)
    results = []
    for caps in rungs:
        res = replay(workload, caps, tick_s=args.tick).to_dict()
        res["workload"] = {**workload.notes, **vars(config), "tick_s": args.tick}
        results.append(res)
        print(row(res), f"({res['wall_s']:.0f}s)", file=sys.stderr, flush=True)
        Path(args.out).write_text(json.dumps(results))
    print(f"workload: {workload.notes}, horizon {workload.horizon_s / 3600:.1f} h, "
          f"saturated bins {results[0]['totals']['saturated_bins']}/{len(results[0]['series']['t_h'])}")
    print(HEADER)
    for res in results:
        print(row(res))
    if args.plot:
        from tide.sim.replay_plot import plot_replay

        plot_replay(results, args.plot, title=f"openb default, {workload.notes['gpus']} GPUs, load {args.load:g}, "
                                              f"speedup {args.speedup:g}, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
