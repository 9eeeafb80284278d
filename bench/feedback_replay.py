"""Trace replay with and without the feedback loop on a workload with under-declared GPU memory.

    .venv/bin/python bench/feedback_replay.py [--seeds 42-46] [--jobs 3000] [--gpus 64] [--json out.json]

The workload (seeded, synthetic: public traces carry no per-job GPU memory need): GPU-share jobs from
``families`` families. Each family declares a share (memory and SM%) and has a true memory need; a
third of the families under-declare it by 1.1-1.8x. Jobs arrive as a Poisson process sized to keep the
GPUs busy; runtimes are lognormal. A run whose share is below its need dies of OOM part-way
(uniformly 10-60 % of its runtime: memory grows as it runs) and is restarted.

- **without feedback**: the restart policy most clusters have: resubmit with the same request, up to
  ``max_resubmits`` times, then the job fails.
- **with feedback**: the same decisions the metrics service makes (``tide.core.feedback``): an OOM raises
  the family's memory multiplier (and the resubmission gets the larger share); the placer applies the
  multiplier to every later job of the family; clean runs decay it, never below the measured peak.

Placement: FIFO with backfill, first fit by SM% and memory on identical 80 GiB GPUs (the placement
policy is the same in both arms; only the requests differ). Useful GPU-hours: SM share x runtime of the
runs that completed, within the horizon (submissions stop at 80 % of it); wasted GPU-hours: the same
for runs that died of OOM.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "libs" / "common"))

from tide.core.feedback import (  # noqa: E402
    FeedbackPolicy,
    after_clean_run,
    after_oom,
    effective_share_mib,
)
from tide.schemas.feedback import FamilyWeights  # noqa: E402

GPU_MIB = 81920
MIB = 1024 * 1024
DEFAULT_POLICY = FeedbackPolicy()


@dataclass(frozen=True)
class Family:
    name: str
    declared_mib: int
    need_mib: int
    sm: int  # SM percent


@dataclass(frozen=True)
class Job:
    job_id: str
    family: Family
    arrival_h: float
    runtime_h: float
    oom_at: float  # fraction of the runtime at which an under-sized run dies


def workload(seed: int, jobs: int, gpus: int, families: int = 40, load: float = 0.9) -> list[Job]:
    rng = random.Random(seed)
    fams = []
    for i in range(families):
        declared = rng.choice([5120, 10240, 10240, 20480, 20480, 40960])
        sm = rng.choice([10, 20, 25, 30, 50])
        if rng.random() < 1 / 3:
            need = int(declared * rng.uniform(1.1, 1.8))
        else:
            need = int(declared * rng.uniform(0.5, 0.95))
        fams.append(Family(f"f{i}", declared, min(need, GPU_MIB), sm))
    weights = [rng.uniform(0.2, 1.0) for _ in fams]
    mean_runtime = math.exp(0.0 + 0.8**2 / 2)  # lognormal(0, 0.8) hours
    mean_sm = sum(f.sm / 100 * w for f, w in zip(fams, weights, strict=True)) / sum(weights)
    rate = load * gpus / (mean_runtime * mean_sm)  # jobs per hour that keep the SMs ~load busy
    t, out = 0.0, []
    for k in range(jobs):
        t += rng.expovariate(rate)
        fam = rng.choices(fams, weights)[0]
        out.append(Job(f"j{k}", fam, t, rng.lognormvariate(0.0, 0.8), rng.uniform(0.1, 0.6)))
    return out


@dataclass
class Gpu:
    sm_free: int = 100
    mib_free: int = GPU_MIB


@dataclass(order=True)
class Ev:
    t: float
    order: int
    kind: str = field(compare=False)
    data: object = field(compare=False, default=None)


@dataclass
class Result:
    oom_kills: int = 0
    completed: int = 0
    failed: int = 0
    useful_gpu_h: float = 0.0
    wasted_gpu_h: float = 0.0
    waits_h: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {"oom_kills": self.oom_kills, "completed": self.completed, "failed": self.failed,
                "useful_gpu_hours": round(self.useful_gpu_h, 1), "wasted_gpu_hours": round(self.wasted_gpu_h, 1),
                "mean_wait_h": round(statistics.fmean(self.waits_h), 3) if self.waits_h else 0.0}


def replay(jobs: list[Job], gpus: int, feedback: bool, policy: FeedbackPolicy = DEFAULT_POLICY) -> Result:
    horizon = jobs[-1].arrival_h / 0.8
    cluster = [Gpu() for _ in range(gpus)]
    weights: dict[str, FamilyWeights] = {}
    res = Result()
    queue: list[tuple[Job, int, int, float]] = []  # job, attempt, memory MiB, queued at
    events: list[Ev] = [Ev(j.arrival_h, i, "arrive", j) for i, j in enumerate(jobs)]
    heapq.heapify(events)
    seq = len(events)

    def request(job: Job) -> int:
        mult = weights[job.family.name].memory_multiplier if feedback and job.family.name in weights else 1.0
        return effective_share_mib(job.family.declared_mib, mult, GPU_MIB)

    def schedule(now: float) -> None:
        nonlocal seq
        still = []
        for job, attempt, mib, since in queue:
            gpu = next((g for g in cluster if g.sm_free >= job.family.sm and g.mib_free >= mib), None)
            if gpu is None:
                still.append((job, attempt, mib, since))
                continue
            gpu.sm_free -= job.family.sm
            gpu.mib_free -= mib
            res.waits_h.append(now - since)
            ooms = mib < job.family.need_mib
            end = now + job.runtime_h * (job.oom_at if ooms else 1.0)
            seq += 1
            heapq.heappush(events, Ev(end, seq, "oom" if ooms else "done", (job, attempt, mib, gpu, now)))
        queue[:] = still

    while events:
        ev = heapq.heappop(events)
        if ev.t > horizon:
            break
        if ev.kind == "arrive":
            job = ev.data  # type: ignore[assignment]
            queue.append((job, 0, request(job), ev.t))
        else:
            job, attempt, mib, gpu, start = ev.data  # type: ignore[misc]
            gpu.sm_free += job.family.sm
            gpu.mib_free += mib
            gpu_h = job.family.sm / 100 * (ev.t - start)
            fam = job.family.name
            if ev.kind == "done":
                res.completed += 1
                res.useful_gpu_h += gpu_h
                if feedback:
                    w = after_clean_run(weights.get(fam), job_id=job.job_id, request_mib=job.family.declared_mib,
                                        peak_bytes=job.family.need_mib * MIB, policy=policy, now=ev.t)
                    if w is not None:
                        weights[fam] = w
            else:
                res.oom_kills += 1
                res.wasted_gpu_h += gpu_h
                if attempt >= policy.max_resubmits:
                    res.failed += 1
                else:
                    if feedback:
                        # the pod's peak when it died: what it had allocated by then (its share, at the most)
                        weights[fam] = after_oom(weights.get(fam), fam, job_id=job.job_id,
                                                 request_mib=job.family.declared_mib, device_mib=GPU_MIB,
                                                 peak_bytes=mib * MIB, policy=policy, now=ev.t)
                    queue.append((job, attempt + 1, request(job), ev.t))
        schedule(ev.t)
    return res


def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=seeds_arg, default=seeds_arg("42-46"))
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        jobs = workload(seed, args.jobs, args.gpus)
        off, on = replay(jobs, args.gpus, False).summary(), replay(jobs, args.gpus, True).summary()
        rows.append({"seed": seed, "without": off, "with": on})
    keys = ["oom_kills", "completed", "failed", "useful_gpu_hours", "wasted_gpu_hours", "mean_wait_h"]
    print(f"{'seed':>5} {'arm':8} " + " ".join(f"{k:>17}" for k in keys))
    for r in rows:
        for arm in ("without", "with"):
            print(f"{r['seed']:>5} {arm:8} " + " ".join(f"{r[arm][k]:>17}" for k in keys))
    print(f"{'mean':>5} {'':8}")
    for arm in ("without", "with"):
        print(f"{'':>5} {arm:8} " + " ".join(f"{statistics.fmean(r[arm][k] for r in rows):>17.2f}" for k in keys))
    if args.json:
        args.json.write_text(json.dumps({"args": {"jobs": args.jobs, "gpus": args.gpus}, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
