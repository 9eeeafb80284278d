"""Preemptions of the full-Tide replay rung, counted by why (victim ids and numbers folded).

    nice -n 10 .venv/bin/python bench/preemption_reasons.py --hours 10 [--seed 43 --load 20]

Prints one JSON object (totals and the count per reason) and a one-line summary. Run it at another
commit (a ``git worktree`` with ``PYTHONPATH`` on its ``libs/common`` and ``services/*``) to compare.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tide.sim.replay import LADDER, Replay, replay  # noqa: E402
from tide.sim.replay_workload import WorkloadConfig, build_workload  # noqa: E402

from bench.replay_ladder import NODES, TRACE  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=10.0, help="virtual hours replayed")
    ap.add_argument("--seed", type=int, default=43)
    ap.add_argument("--load", type=float, default=20.0)
    args = ap.parse_args(argv)
    reasons: collections.Counter[str] = collections.Counter()
    preempt = Replay._preempt

    def counting(self: Replay, job_id: str, by: str, why: str, t: float) -> None:
        reasons[re.sub(r"[\w-]+-\d+|\d+(\.\d+)?", "#", why)[:80]] += 1
        preempt(self, job_id, by, why, t)

    Replay._preempt = counting  # type: ignore[method-assign]
    by_hour: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0.0])  # hour -> [preemptions, GPU-h lost]
    by_gpus: collections.Counter[str] = collections.Counter()  # victim GPUs -> GPU-h lost
    requeue = Replay._requeue

    def measuring(self: Replay, job_id: str, attempt: int) -> None:
        before = self.stats["preempted_gpu_h_lost"]
        gpus = sum(sum(a.gpu_milli) for a in self.running[job_id][1]) / 1000 if job_id in self.running else 0.0
        requeue(self, job_id, attempt)
        lost = self.stats["preempted_gpu_h_lost"] - before
        if lost or self.records[job_id].state.value == "pending":
            bucket = by_hour[int(self.last_t // 3600)]
            bucket[0] += 1
            bucket[1] += lost
            by_gpus[f"{gpus:g}"] += lost

    Replay._requeue = measuring  # type: ignore[method-assign]
    config = WorkloadConfig(seed=args.seed, nodes=40, speedup=50.0, load=args.load, horizon_s=args.hours * 3600)
    workload = build_workload(NODES, TRACE, config)
    started = time.perf_counter()
    totals = replay(workload, LADDER[-1], tick_s=30.0).to_dict()["totals"]
    out = {"seed": args.seed, "load": args.load, "hours": args.hours,
           **{k: totals[k] for k in ("preemptions", "preempted_gpu_h_lost", "completed", "gpu_alloc_saturated_pct")},
           "reasons": dict(reasons.most_common()),
           "by_hour": {h: [n, round(lost, 2)] for h, (n, lost) in sorted(by_hour.items())},
           "gpu_h_lost_by_victim_gpus": {g: round(v, 2) for g, v in by_gpus.most_common()},
           "wall_s": round(time.perf_counter() - started, 1)}
    print(json.dumps(out))
    top = ", ".join(f"{n} {why}" for why, n in reasons.most_common(3))
    print(f"preemption_reasons {args.hours:g} h seed {args.seed}: {out['preemptions']} preemptions, "
          f"{out['preempted_gpu_h_lost']:.1f} GPU-h lost ({top})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
