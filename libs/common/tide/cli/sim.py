"""`tide sim openb ...`: replay an openb trace through the placement core."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

NODE_LIST = "openb_node_list_gpu_node.csv"
TRACES_ENV = "TIDE_TRACES_DIR"
PROJECT = Path(__file__).resolve().parents[4]
"""the source checkout this module runs from (``libs/common/tide/cli/sim.py``); meaningless once installed"""


def trace_dirs() -> list[Path]:
    """Where the openb node list is looked for when ``--nodes`` is not given: ``$TIDE_TRACES_DIR``, then the
    shipped traces beside the project (``shared/traces/openb`` inside the checkout, or next to it)."""
    env = os.environ.get(TRACES_ENV, "").strip()
    return [*([Path(env)] if env else []), PROJECT / "shared" / "traces" / "openb",
            PROJECT.parent / "shared" / "traces" / "openb"]


SIM_EXTRA = "pip install 'tide-scheduler[sim]'"


class NoNodeList(ValueError):
    pass


def node_list(given: str | None) -> Path:
    """The node list CSV: ``--nodes`` when given (it must exist), else the first default that exists."""
    if given is not None:
        if not Path(given).is_file():
            raise NoNodeList(f"--nodes {given}: no such file")
        return Path(given)
    for folder in trace_dirs():
        if (folder / NODE_LIST).is_file():
            return folder / NODE_LIST
    looked = ", ".join(str(d / NODE_LIST) for d in trace_dirs())
    raise NoNodeList(f"no node list: pass --nodes FILE (an openb {NODE_LIST}) or set {TRACES_ENV} to the folder "
                     f"holding it (looked at {looked})")


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_format", required=True)
    p = sub.add_parser("openb", help="replay an openb (Alibaba GPU v2023) trace")
    p.add_argument("--nodes", help=f"node list CSV (default: {NODE_LIST} in ${TRACES_ENV} or the project's "
                                   "shared/traces/openb)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--pods", help="pod list CSV")
    src.add_argument("--trace", help="openb trace by name, next to the node list: a shipped file (cpu200) or a "
                                     "generated CPU-heavier variant (cpu300-gen1: 30%% CPU-only pods, seed 1)")
    p.add_argument("--policy", action="append", help="policy name (repeatable; 'default' = live default)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--inflate", type=float, default=1.3, help="total GPU request / capacity (default 1.3)")
    p.add_argument("--json", dest="json_out", help="write the result(s) as JSON here ('-' for stdout)")
    p.add_argument("--plot", help="draw allocation and fragmentation curves to this PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=run_sim)
    r = sub.add_parser("replay", help="discrete-event replay through the live scheduling cycle (capability ladder)")
    r.add_argument("--nodes", help="node list CSV (default: as for `sim openb`)")
    r.add_argument("--pods", help="pod list CSV (openb format, with creation/deletion times)")
    r.add_argument("--check-log", help="re-plan a placer decision log (TIDE_DECISION_LOG) and report differences")
    r.add_argument("--policy", action="append",
                   help="capability rung(s) by number (0 = FIFO + first-fit, whole GPUs ... 6 = full Tide), "
                        "'ladder' for all, or a placement policy name for full Tide with that policy")
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--speedup", type=float, default=50.0, help="divide inter-arrival times by this")
    r.add_argument("--load", type=float, default=20.0, help="copies per sampled pod (Poisson mean): load level")
    r.add_argument("--slice", dest="slice_nodes", type=int, default=40, help="GPU nodes sampled (0: all)")
    r.add_argument("--start-day", type=float, default=115.0, help="skip trace pods created before this day")
    r.add_argument("--horizon-h", type=float, help="stop after this many virtual hours")
    r.add_argument("--tick", type=float, default=30.0, help="cycle tick in virtual seconds")
    r.add_argument("--json", dest="json_out", help="write the result(s) as JSON here ('-' for stdout)")
    r.add_argument("--plot", help="draw GPU allocation over time to this PNG")
    r.set_defaults(handler=run_replay)


def add_sim_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `sim` on a `tide` CLI subparsers object."""
    parser = subparsers.add_parser("sim", help="trace simulator for the placement core")
    add_sim_arguments(parser)
    return parser


def run_sim(args: argparse.Namespace) -> int:
    from tide.core.placer import DEFAULT_POLICY, POLICIES
    from tide.sim.openb import load_nodes, load_pods
    from tide.sim.openb_variants import load_trace
    from tide.sim.simulator import simulate

    policies = [DEFAULT_POLICY if p == "default" else p for p in (args.policy or ["default"])]
    for p in policies:
        if p not in POLICIES:
            print(f"unknown policy {p!r}; known: default, {', '.join(POLICIES)}", file=sys.stderr)
            return 2
    nodes_csv = _checked_inputs(args)
    if nodes_csv is None:
        return 2
    nodes = load_nodes(nodes_csv)
    if args.trace:
        trace = args.trace
        requests = [p.request for p in load_trace(trace, nodes_csv.parent)]
    else:
        trace = Path(args.pods).stem.removeprefix("openb_pod_list_")
        requests = [p.request for p in load_pods(args.pods)]
    results = []
    for policy in policies:
        if args.no_progress or not sys.stderr.isatty() or not _have("rich"):
            res = simulate(nodes, requests, policy, seed=args.seed, inflate=args.inflate, trace=trace)
        else:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task(f"{trace} {policy} seed {args.seed}", total=None)

                def tick(done: int, total: int, _t=task, _b=bar) -> None:
                    if done % 100 == 0 or done == total:
                        _b.update(_t, completed=done, total=total)

                res = simulate(nodes, requests, policy, seed=args.seed, inflate=args.inflate, progress=tick,
                               trace=trace)
        d = res.to_dict()
        results.append(d)
        print(
            f"{trace} policy={policy} seed={args.seed}: allocated {d['allocated_pct_at_100']:.2f}% at 100% arrived,"
            f" {d['pods_failed']}/{d['pods_arrived']} pods failed, {d['wall_s']:.1f}s",
            file=sys.stderr,
        )
    if args.json_out:
        payload = results[0] if len(results) == 1 else results
        text = json.dumps(payload)
        if args.json_out == "-":
            print(text)
        else:
            Path(args.json_out).write_text(text)
    if args.plot:
        from tide.sim.plot import plot_results

        plot_results(results, args.plot, title=f"openb {trace}, seed {args.seed}")
    return 0


def run_replay(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from tide.core.placer import POLICIES
    from tide.sim.replay import FULL, LADDER, replay
    from tide.sim.replay_workload import WorkloadConfig, build_workload

    if args.check_log:
        from tide.sim.replay_log import check_log

        cycles, diffs = check_log(args.check_log)
        for diff in diffs:
            print(diff, file=sys.stderr)
        print(f"{cycles} cycles re-planned, {len(diffs)} with different binds", file=sys.stderr)
        return 1 if diffs else 0
    if not args.pods:
        print("--pods is required (or --check-log)", file=sys.stderr)
        return 2
    rungs = []
    for name in args.policy or ["6"]:
        if name == "ladder":
            rungs += list(LADDER)
        elif name.isdigit() and int(name) < len(LADDER):
            rungs.append(LADDER[int(name)])
        elif name in POLICIES:
            rungs.append(replace(FULL, name=f"full Tide, policy {name}", policy=name))
        else:
            print(f"unknown rung/policy {name!r}: 0-{len(LADDER) - 1}, ladder, or {', '.join(POLICIES)}",
                  file=sys.stderr)
            return 2
    config = WorkloadConfig(seed=args.seed, nodes=args.slice_nodes, speedup=args.speedup, load=args.load,
                            start_day=args.start_day,
                            horizon_s=args.horizon_h * 3600 if args.horizon_h else None)
    nodes_csv = _checked_inputs(args)
    if nodes_csv is None:
        return 2
    workload = build_workload(nodes_csv, args.pods, config)
    results = []
    for caps in rungs:
        res = replay(workload, caps, tick_s=args.tick).to_dict()
        res["workload"] = {**workload.notes, **{k: v for k, v in vars(config).items()}}
        results.append(res)
        t = res["totals"]
        online = t["queueing_delay_s"].get("online-serving", {})
        print(f"{caps.name}: alloc {t['gpu_alloc_pct']:.1f}% (saturated {t['gpu_alloc_saturated_pct'] or 0:.1f}%),"
              f" useful {t['useful_gpu_h']:.0f} GPU-h, online p99 wait {online.get('p99') or 0:.1f}s,"
              f" {t['preemptions']} preemptions, {t['oom_kills']} OOM, {res['wall_s']:.1f}s", file=sys.stderr)
    if args.json_out:
        text = json.dumps(results[0] if len(results) == 1 else results)
        if args.json_out == "-":
            print(text)
        else:
            Path(args.json_out).write_text(text)
    if args.plot:
        from tide.sim.replay_plot import plot_replay

        plot_replay(results, args.plot, title=f"openb {Path(args.pods).stem.removeprefix('openb_pod_list_')}, "
                                              f"load {args.load:g}, speedup {args.speedup:g}, seed {args.seed}")
    return 0


def _checked_inputs(args: argparse.Namespace) -> Path | None:
    """The node list, or None (the reason printed) when there is none or ``--plot`` cannot be drawn."""
    try:
        nodes_csv = node_list(args.nodes)
    except NoNodeList as exc:
        print(f"tide sim: {exc}", file=sys.stderr)
        return None
    if args.plot and not _have("matplotlib"):
        print(f"tide sim: --plot needs matplotlib: {SIM_EXTRA}", file=sys.stderr)
        return None
    return nodes_csv


def _have(module: str) -> bool:
    """An optional package (the ``sim`` extra: rich, matplotlib) is installed."""
    import importlib.util

    return importlib.util.find_spec(module) is not None
