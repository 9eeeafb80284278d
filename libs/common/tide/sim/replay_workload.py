"""The replay's workload: an openb trace with seeded additions for what the trace lacks.

Everything here is deterministic in ``WorkloadConfig.seed`` (one ``numpy`` generator, drawn in a fixed
order). From the trace:

- **slice**: ``nodes`` GPU nodes drawn without replacement (kept in trace order), and each pod kept
  with probability ``nodes / all nodes`` (a proportional sample); pods the trace never scheduled
  (no ``scheduled_time``) are dropped: their runtime is unknown;
- **time**: pods created from day ``start_day`` on (where 80 % of the default trace's pods arrive) are
  kept; each is copied Poisson(``load``) times (``load`` sets the load level; copies arrive up to 600 s
  later); a pod arrives at ``(creation_time - start_day) / speedup`` and runs for
  ``deletion_time - scheduled_time`` (capped at ``max_runtime_s``): ``speedup`` raises the offered load
  without changing the runtimes.

Added (the openb traces have none of these):

- **pools and tides**: ``inference_share`` of the sliced nodes are labelled ``pool=inference``, the
  rest ``pool=training``; trace pods select ``pool=training``. A tide rule lends idle inference nodes to
  training from 22:00 to 07:00 (returned 600 s before the end), keeping ``tide_keep_gpus`` whole GPUs
  of the inference pool free for serving jobs arriving in the window (``keepGPUs``);
- **online serving with a day/night load**: a seeded Poisson stream (by thinning) of ``online-serving``
  jobs selecting ``pool=inference``, half 1 GPU and half 25/50 % shares, lognormal runtimes (median
  ``serving_median_s``), at a rate that keeps ``serving_peak`` of the inference GPUs busy at 14:00 and
  30 % of that at 02:00 (a cosine in between);
- **priority classes**: ``best_effort_share`` of trace pods are ``best-effort``, the rest
  ``offline-training``; serving jobs are ``online-serving``;
- **queues/tenants**: trace pods go to ``research`` / ``product`` / ``batch`` (40/30/30 %), with weights
  3/2/1 and guarantees of 30 %/20 %/0 of the training GPUs; ``serving`` is guaranteed the inference GPUs;
- **gangs**: ``gang_share`` of the whole-GPU trace pods become gangs of 2 or 4 copies of the pod
  (``topology.prefer: rack``; 8-GPU pods ``require: rack``);
- **under-declared GPU memory**: shares declare ``milli x 15 GiB`` of GPU memory and belong to one of
  ``families`` families (the ``family`` label); a third of the families need 1.1-1.8x what they declare,
  the others 0.5-0.95x. A run whose GPU memory is below its need dies of OOM after 10-60 % of its
  runtime (drawn per job);
- **declared runtimes**: every training pod declares ``runtimeSeconds`` = its runtime x U(1, 1.5)
  (lets backfill in front of a waiting gang work); checkpoints every ``checkpoint_s`` of run time.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tide.core.model import MILLI
from tide.schemas.job import JobSpec
from tide.schemas.node import NodeDescription
from tide.sim.openb import load_nodes

SHARE_MEMORY_PER_GPU_MIB = 15_000  # a share declares milli/1000 of this (fits the smallest openb GPU, T4)
TENANTS = (("research", 3.0, 0.30, 0.4), ("product", 2.0, 0.20, 0.3), ("batch", 1.0, 0.0, 0.3))
TIDE_RULE = {"lend": "inference", "to": "training", "start": "22:00", "end": "07:00", "returnBeforeSeconds": 600}
MAX_DECLARED_S = 90 * 24 * 3600


@dataclass(frozen=True)
class WorkloadConfig:
    seed: int = 42
    nodes: int = 40  # GPU nodes in the slice (0: all)
    speedup: float = 50.0
    start_day: float = 115.0  # trace pods created before this day are left out (the trace's sparse months)
    load: float = 20.0  # copies of each sampled pod (Poisson mean): the load level
    max_runtime_s: float = 14 * 24 * 3600
    inference_share: float = 0.15
    serving_peak: float = 0.85
    serving_median_s: float = 7200.0
    best_effort_share: float = 0.2
    gang_share: float = 0.15
    families: int = 40
    checkpoint_s: float = 1800.0
    horizon_s: float | None = None  # default: the last trace arrival
    start_hour: float = 18.0  # virtual time 0 is this time of day (so a short run crosses a night)
    tide_keep_gpus: int = 2  # the tide rule's keepGPUs: serving headroom while inference nodes are lent


@dataclass
class ReplayJob:
    job_id: str
    spec: JobSpec
    arrival: float
    duration: float
    priority_class: str  # as generated (reported by class even when a rung flattens priorities)
    need_mib: int | None = None  # GPU memory a pod really needs (shares); None: what it declares is enough
    oom_fraction: float = 0.0  # an under-sized run dies after this fraction of its runtime

    @property
    def gang(self) -> int:
        return self.spec.spec.gang_size


@dataclass
class Workload:
    nodes: list[NodeDescription]
    jobs: list[ReplayJob]
    queue_config: dict
    horizon_s: float
    config: WorkloadConfig
    notes: dict = field(default_factory=dict)

    @property
    def gpu_capacity(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


def _spec(name: str, *, queue: str, priority: str, pool: str, gpu: int = 0, milli: int = 0, share_mib: int = 0,
          cpu: int = 1000, memory: int = 1024, models: tuple[str, ...] = (), replicas: int = 1,
          topology: dict | None = None, runtime: float | None = None, family: str | None = None) -> JobSpec:
    resources: dict = {"cpuMilli": cpu, "memoryMiB": memory}
    if gpu:
        resources["gpu"] = gpu
    elif milli:
        resources["gpuShare"] = {"smPercent": max(1, min(100, math.ceil(milli / 10))), "memoryMiB": share_mib}
    if models:
        resources["gpuModel"] = list(models)
    body: dict = {"replicas": replicas, "template": {"command": ["replay"], "resources": resources,
                                                     "nodeSelector": {"pool": pool}}}
    if topology:
        body["topology"] = topology
    if runtime is not None:
        body["runtimeSeconds"] = min(max(runtime, 1.0), MAX_DECLARED_S)
    labels = {"family": family} if family else {}
    return JobSpec.model_validate({"metadata": {"name": name, "queue": queue, "priorityClass": priority,
                                                "labels": labels}, "spec": body})


def _relabel(node: NodeDescription, pool: str) -> NodeDescription:
    return node.model_copy(update={"labels": {**node.labels, "pool": pool}})


def build_workload(nodes_csv: str | Path, pods_csv: str | Path, config: WorkloadConfig) -> Workload:
    rng = np.random.default_rng(config.seed)
    all_nodes = [n for n in load_nodes(nodes_csv) if n.gpus]
    keep = len(all_nodes) if not config.nodes or config.nodes >= len(all_nodes) else config.nodes
    chosen = sorted(rng.choice(len(all_nodes), size=keep, replace=False).tolist())
    sliced = [all_nodes[i] for i in chosen]
    inference = set(rng.choice(len(sliced), size=round(config.inference_share * len(sliced)), replace=False).tolist())
    nodes = [_relabel(n, "inference" if i in inference else "training") for i, n in enumerate(sliced)]
    inf_gpus = sum(len(n.gpus) for i, n in enumerate(nodes) if i in inference)
    train_gpus = sum(len(n.gpus) for n in nodes) - inf_gpus
    keep_p = keep / len(all_nodes)

    with open(pods_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    first = int(config.start_day * 86400)
    rows = [r for r in rows if int(r["creation_time"]) >= first]
    family_need = {k: (float(rng.uniform(1.1, 1.8)) if rng.random() < 1 / 3 else float(rng.uniform(0.5, 0.95)))
                   for k in range(config.families)}
    jobs: list[ReplayJob] = []
    for row in rows:
        copies = int(rng.poisson(config.load * keep_p))
        for copy in range(copies if row.get("scheduled_time") else 0):
            job = _trace_job(rng, config, row, first, copy, family_need)
            if job is not None:
                jobs.append(job)
    horizon = config.horizon_s or max((j.arrival for j in jobs), default=0.0)
    jobs += _serving(rng, config, inf_gpus, horizon)
    jobs.sort(key=lambda j: (j.arrival, j.job_id))
    queue_config = {
        "queues": [{"name": "serving", "weight": 1, "guarantee": {"gpu": inf_gpus}}]
        + [{"name": name, "weight": w, **({"guarantee": {"gpu": round(g * train_gpus, 1)}} if g else {})}
           for name, w, g, _ in TENANTS],
        "tides": [{**TIDE_RULE, "keepGPUs": config.tide_keep_gpus}],
    }
    notes = {"nodes": len(nodes), "gpus": inf_gpus + train_gpus, "inference_gpus": inf_gpus,
             "training_gpus": train_gpus, "trace_jobs": sum(j.priority_class != "online-serving" for j in jobs),
             "serving_jobs": sum(j.priority_class == "online-serving" for j in jobs)}
    return Workload(nodes, [j for j in jobs if j.arrival <= horizon], queue_config, horizon, config, notes)


def _trace_job(rng: np.random.Generator, config: WorkloadConfig, row: dict, first: int, copy: int,
               family_need: dict[int, float]) -> ReplayJob | None:
    num_gpu, milli = int(row.get("num_gpu") or 0), int(row.get("gpu_milli") or 0)
    if num_gpu == 0:
        return None  # CPU-only pods: not GPU work (they would only add CPU pressure)
    arrival = (int(row["creation_time"]) - first) / config.speedup + (float(rng.uniform(0, 600)) if copy else 0.0)
    duration = float(min(max(int(row["deletion_time"]) - int(row["scheduled_time"]), 1), config.max_runtime_s))
    spec_models = tuple(sorted({m for m in (row.get("gpu_spec") or "").split("|") if m}))
    share = num_gpu == 1 and 0 < milli < MILLI
    priority = "best-effort" if rng.random() < config.best_effort_share else "offline-training"
    u = rng.random()
    queue = next(name for name, _, _, cum in _cumulative() if u < cum)
    declared = duration * float(rng.uniform(1.0, 1.5))
    job_id = row["name"].removeprefix("openb-") + (f"-c{copy}" if copy else "")
    need, oom_fraction, family, share_mib, replicas, topology = None, 0.0, None, 0, 1, None
    if share:
        k = int(rng.integers(config.families))
        family = f"fam-{k}"
        share_mib = max(1, round(milli / MILLI * SHARE_MEMORY_PER_GPU_MIB))
        need = round(share_mib * family_need[k])
        oom_fraction = float(rng.uniform(0.1, 0.6))
    elif rng.random() < config.gang_share:
        replicas = 2 if rng.random() < 0.5 else 4
        topology = {"require": "rack"} if num_gpu >= 8 else {"prefer": "rack"}
    spec = _spec(job_id, queue=queue, priority=priority, pool="training", gpu=0 if share else num_gpu,
                 milli=milli if share else 0, share_mib=share_mib, cpu=int(row["cpu_milli"]),
                 memory=int(row["memory_mib"]), models=spec_models, replicas=replicas, topology=topology,
                 runtime=declared, family=family)
    return ReplayJob(job_id, spec, arrival, duration, priority, need, oom_fraction)


def _cumulative() -> list[tuple[str, float, float, float]]:
    out, total = [], 0.0
    for name, w, g, share in TENANTS:
        total += share
        out.append((name, w, g, total if name != TENANTS[-1][0] else 1.01))
    return out


def serving_level(t: float) -> float:
    """Serving load at ``t`` seconds after midnight as a share of its 14:00 peak."""
    hour = (t / 3600.0) % 24.0
    return 0.3 + 0.7 * (0.5 - 0.5 * math.cos(2 * math.pi * (hour - 2.0) / 24.0))


def _serving(rng: np.random.Generator, config: WorkloadConfig, inf_gpus: int, horizon: float) -> list[ReplayJob]:
    if inf_gpus == 0 or config.serving_peak <= 0:
        return []
    sigma = 0.6
    mean_duration = config.serving_median_s * math.exp(sigma**2 / 2)
    mean_gpu = 0.5 * 1.0 + 0.5 * 0.375
    peak_rate = config.serving_peak * inf_gpus / (mean_gpu * mean_duration)
    jobs, t, k = [], 0.0, 0
    while True:
        t += float(rng.exponential(1.0 / peak_rate))
        if t > horizon:
            return jobs
        if rng.random() >= serving_level(t + config.start_hour * 3600):
            continue
        duration = float(rng.lognormal(math.log(config.serving_median_s), sigma))
        whole = rng.random() < 0.5
        pct = 25 if rng.random() < 0.5 else 50
        job_id = f"serve-{k:05d}"
        k += 1
        spec = _spec(job_id, queue="serving", priority="online-serving", pool="inference",
                     gpu=1 if whole else 0, milli=0 if whole else pct * 10,
                     share_mib=0 if whole else pct * SHARE_MEMORY_PER_GPU_MIB // 100,
                     cpu=4000, memory=16384, family=None if whole else "serving")
        jobs.append(ReplayJob(job_id, spec, float(math.ceil(t)), duration, "online-serving"))
