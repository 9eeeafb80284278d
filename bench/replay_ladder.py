"""The capability ladder: `tide sim replay` on seeded openb workloads, rung by rung, at a load level.

    nice -n 10 .venv/bin/python bench/replay_ladder.py --load 20 --seeds 42,43,44 \
        --out bench/results/replay_ladder_load20.json --plot docs/replay_load20.png
    nice -n 10 .venv/bin/python bench/replay_ladder.py --load 12 --seeds 42,43,44 \
        --out bench/results/replay_ladder_load12.json --plot docs/replay_load12.png

Each seed draws its own workload (node slice, trace copies, serving stream, gangs, tenants, OOM
families: see `tide.sim.replay_workload`); every rung of a seed replays that same workload.
Prints the markdown tables of docs/benchmarks.md ("Replay"): the mean over seeds (key columns with
their min-max over seeds), then the key columns per seed. The JSON (`--out`) holds:

- ``load``, ``seeds``, ``rungs`` (names in ladder order);
- ``summary``: per rung, ``per_seed`` (seed -> the table's figures) and ``mean`` (over the seeds that
  have the figure; ``n`` says how many) and ``min`` / ``max``;
- ``runs``: every (seed, rung) result of `tide sim replay --json` (totals, series, workload).

Rungs or seeds can be run in separate processes (`--rungs`, `--seeds`) and merged (`--merge`, which
also reads the earlier format: a plain list of results).
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
NAMES = [c.name for c in LADDER]

# the table's figures of one result, by name (None where a run has none, e.g. no saturated bin)
KEY = ("gpu_alloc_saturated_pct", "useful_gpu_h", "online_p99_wait_s", "training_wait_p95_s", "gang_wait_p95_s",
       "oom_kills")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def figures(res: dict) -> dict[str, float | None]:
    return {k: _r(v) for k, v in _figures(res).items()}


def _figures(res: dict) -> dict[str, float | None]:
    t = res["totals"]
    q = t["queueing_delay_s"]
    online = q.get("online-serving", {})
    train = q.get("offline-training", {})
    jct = t["jct_s"].get("offline-training", {})
    return {
        "gpu_alloc_pct": t["gpu_alloc_pct"],
        "gpu_alloc_saturated_pct": t["gpu_alloc_saturated_pct"],
        "useful_gpu_h": t["useful_gpu_h"],
        "online_p99_wait_s": online.get("p99"),
        "training_wait_p50_s": train.get("p50"),
        "training_wait_p95_s": train.get("p95"),
        "training_wait_p99_s": train.get("p99"),
        "training_jct_p50_h": jct["p50"] / 3600 if jct.get("p50") is not None else None,
        "gang_wait_p95_s": t["gang_wait_s"]["p95"],
        "preemptions": t["preemptions"],
        "preempted_gpu_h_lost": t["preempted_gpu_h_lost"],
        "oom_kills": t["oom_kills"],
        "idle_held_gpu_h": t["idle_held_gpu_h"],
        "frag_pct_mean": t["frag_pct_mean"],
        "completed": t["completed"],
        "pending_at_end": t["pending_at_end"],
        "saturated_bins": t["saturated_bins"],
        "wall_s": res.get("wall_s"),
    }


def summarize(runs: list[dict]) -> dict:
    seeds = sorted({r["seed"] for r in runs})
    rungs = [n for n in NAMES if any(r["capabilities"]["name"] == n for r in runs)]
    rungs += sorted({r["capabilities"]["name"] for r in runs} - set(rungs))
    summary = []
    for name in rungs:
        per_seed = {str(r["seed"]): figures(r) for r in sorted(runs, key=lambda r: r["seed"])
                    if r["capabilities"]["name"] == name}
        mean, lo, hi, n = {}, {}, {}, {}
        for k in next(iter(per_seed.values())):
            vals = [f[k] for f in per_seed.values() if f[k] is not None]
            n[k] = len(vals)
            mean[k] = _r(sum(vals) / len(vals)) if vals else None
            lo[k] = min(vals) if vals else None
            hi[k] = max(vals) if vals else None
        summary.append({"rung": name, "seeds": [int(s) for s in per_seed], "mean": mean, "min": lo, "max": hi,
                        "n": n, "per_seed": per_seed})
    load = runs[0]["workload"]["load"] if runs else None
    return {"load": load, "seeds": seeds, "rungs": rungs, "summary": summary, "runs": runs}


def load_runs(path: str | Path) -> list[dict]:
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, list) else data["runs"]


def merge_runs(runs: list[dict]) -> list[dict]:
    """One result per (seed, rung), the last given winning; in seed, then ladder order."""
    by_key = {(r["seed"], r["capabilities"]["name"]): r for r in runs}
    order = {n: i for i, n in enumerate(NAMES)}
    return [by_key[k] for k in sorted(by_key, key=lambda k: (k[0], order.get(k[1], len(order)), k[1]))]


def dump(summary: dict) -> str:
    """The JSON text: everything but the runs indented (readable), one line per run."""
    head = {k: v for k, v in summary.items() if k != "runs"}
    body = json.dumps(head, indent=1)[:-2]
    runs = ",\n".join(json.dumps(r) for r in summary["runs"])
    return f'{body},\n "runs": [\n{runs}\n ]\n}}\n'


def fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def spread(s: dict, k: str, digits: int = 0) -> str:
    """mean, with (min-max) over seeds when there is more than one."""
    if s["mean"][k] is None:
        return "-"
    if s["n"][k] <= 1:
        return fmt(s["mean"][k], digits)
    return f"{fmt(s['mean'][k], digits)} ({fmt(s['min'][k], digits)}-{fmt(s['max'][k], digits)})"


HEADER = ("| rung | GPU alloc % | alloc % (saturated) | useful GPU-h | online p99 wait (s)"
          " | training wait p50/p95/p99 (s) | training JCT p50 (h) | gang wait p95 (s) | preemptions / GPU-h lost"
          " | OOM kills | GPU-h held idle (gang-off) | frag % | jobs done | pending at end |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def row(s: dict, seeds: list[int]) -> str:
    """The table row of one rung: means over seeds; the key columns with their min-max over seeds."""
    m = s["mean"]
    name = s["rung"] if s["seeds"] == seeds else f"{s['rung']} (seed {', '.join(map(str, s['seeds']))} only)"
    return (f"| {name} | {fmt(m['gpu_alloc_pct'], 1)} | {spread(s, 'gpu_alloc_saturated_pct', 1)}"
            f" | {spread(s, 'useful_gpu_h')} | {spread(s, 'online_p99_wait_s')} | {fmt(m['training_wait_p50_s'])} /"
            f" {spread(s, 'training_wait_p95_s')} / {fmt(m['training_wait_p99_s'])}"
            f" | {fmt(m['training_jct_p50_h'], 2)} | {spread(s, 'gang_wait_p95_s')}"
            f" | {fmt(m['preemptions'])} / {fmt(m['preempted_gpu_h_lost'], 1)} | {spread(s, 'oom_kills')}"
            f" | {fmt(m['idle_held_gpu_h'], 1)} | {fmt(m['frag_pct_mean'], 1)} | {fmt(m['completed'])}"
            f" | {fmt(m['pending_at_end'])} |")


def per_seed_table(summary: dict) -> str:
    seeds = [str(s) for s in summary["seeds"]]
    cols = [("alloc % (saturated)", "gpu_alloc_saturated_pct", 1), ("useful GPU-h", "useful_gpu_h", 0),
            ("online p99 wait (s)", "online_p99_wait_s", 0), ("training wait p95 (s)", "training_wait_p95_s", 0),
            ("gang wait p95 (s)", "gang_wait_p95_s", 0), ("OOM kills", "oom_kills", 0)]
    lines = ["| rung | " + " | ".join(f"{title}: {' / '.join(seeds)}" for title, _, _ in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for s in summary["summary"]:
        cells = [" / ".join(fmt(s["per_seed"][seed][k], d) if seed in s["per_seed"] else "n/a" for seed in seeds)
                 for _, k, d in cols]
        lines.append(f"| {s['rung']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tables(summary: dict) -> str:
    seeds = ", ".join(str(s) for s in summary["seeds"])
    return (f"mean over seeds {seeds} (key columns: mean (min-max over seeds)):\n\n{HEADER}\n"
            + "\n".join(row(s, summary["seeds"]) for s in summary["summary"])
            + f"\n\nper seed ({seeds}):\n\n{per_seed_table(summary)}\n")


def plot(summary: dict, path: str) -> None:
    from tide.sim.replay_plot import plot_replay_seeds

    runs = summary["runs"]
    w = runs[0]["workload"]
    by_seed = {s: [r for r in runs if r["seed"] == s] for s in summary["seeds"]}
    plot_replay_seeds(by_seed, path, title=f"openb default, {w['nodes']}-node slices, load {w['load']:g}, "
                                           f"speedup {w['speedup']:g}", order=NAMES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", default=TRACE)
    ap.add_argument("--nodes", default=NODES)
    ap.add_argument("--seed", type=int, default=42, help="one seed (see --seeds)")
    ap.add_argument("--seeds", default="", help="comma-separated seeds, each its own workload (default: --seed)")
    ap.add_argument("--load", type=float, default=20.0)
    ap.add_argument("--speedup", type=float, default=50.0)
    ap.add_argument("--slice", type=int, default=40)
    ap.add_argument("--tick", type=float, default=30.0)
    ap.add_argument("--hours", type=float, default=None,
                    help="virtual hours replayed (default: until the last trace arrival, 16.5 h at speedup 50); "
                         "serving jobs keep arriving and the backlog drains until then")
    ap.add_argument("--keep-gpus", type=int, default=WorkloadConfig.tide_keep_gpus,
                    help="the tide rule's keepGPUs (serving headroom in the lending window)")
    ap.add_argument("--rungs", default="", help="comma-separated rung numbers (default: all)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--merge", nargs="+", help="do not run: merge these result files into --out")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    if args.merge:
        summary = summarize(merge_runs([r for f in args.merge for r in load_runs(f)]))
        Path(args.out).write_text(dump(summary))
        print(tables(summary))
        if args.plot:
            plot(summary, args.plot)
        return 0
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    rungs = [LADDER[int(k)] for k in args.rungs.split(",")] if args.rungs else list(LADDER)
    runs: list[dict] = []
    for seed in seeds:
        config = WorkloadConfig(seed=seed, nodes=args.slice, speedup=args.speedup, load=args.load,
                                tide_keep_gpus=args.keep_gpus,
                                horizon_s=args.hours * 3600 if args.hours is not None else None)
        workload = build_workload(args.nodes, args.pods, config)
        print(f"seed {seed}: workload {workload.notes}, horizon {workload.horizon_s / 3600:.1f} h",
              file=sys.stderr, flush=True)
        for caps in rungs:
            res = replay(workload, caps, tick_s=args.tick).to_dict()
            res["workload"] = {**workload.notes, **vars(config), "tick_s": args.tick}
            runs.append(res)
            f = figures(res)
            print(f"  seed {seed} {caps.name}: saturated alloc {fmt(f['gpu_alloc_saturated_pct'], 1)} %, useful "
                  f"{fmt(f['useful_gpu_h'])} GPU-h, online p99 {fmt(f['online_p99_wait_s'])} s, "
                  f"saturated bins {f['saturated_bins']} ({res['wall_s']:.0f}s)", file=sys.stderr, flush=True)
            Path(args.out).write_text(dump(summarize(runs)))
    summary = summarize(runs)
    print(tables(summary))
    if args.plot:
        plot(summary, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
