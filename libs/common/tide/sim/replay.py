"""`tide sim replay`: a discrete-event replay of a workload on a virtual clock through the live decisions.

Each cycle is ``tide.core.cycle.plan_cycle`` with the placer's own ``Placer(policy)``, exactly as the
placer service calls it; the replay only gathers the snapshot and carries out the plan, as the
service does with Redis and node agents:

- events: arrivals, pod completions, OOM kills, preempted pods gone (after the victim's grace period),
  tide window edges; event times are rounded up to the next tick (``tick_s``, 30 s by default, to keep
  a run fast; online-serving arrivals to the next second, as the placer is kicked on each submission)
  and one cycle runs after the events of each tick;
- binds: ``cluster.allocate`` and the job's record (attempt, pods, ``mark_pod_started``);
- preemptions: the victim is marked preempted (``preemptions`` + 1), its claims stay until its grace
  period ends, then it is requeued with its original submission time; the preemptor is nominated;
- elastic jobs: a bind's extra pods start with it; extras for running jobs (``Plan.grows``) start at
  once; a preempted extra pod gives its GPUs back at once and wants placement again (the job runs on);
  the work of a job does not depend on its extras;
- gang timeouts (``Plan.timed_out``): ``fail`` ends the job failed, ``shrink`` takes the new spec;
- exits: ``mark_pod_exited`` decides the job's outcome; an OOM-failed job is resubmitted: with the
  feedback loop through ``tide.core.feedback`` (family multiplier, ``resubmission``), without it with
  the same request (a user retrying), at most ``FeedbackPolicy.max_resubmits`` times either way.

Capabilities are switches on the same code (``Capabilities``): whole GPUs only (a share asks for a
whole GPU), gang awareness off (a gang's pods are submitted as independent jobs; the gang starts
when its last pod starts and the others hold their GPUs idle until then), the placement policy,
queues/priorities/preemption/tides off (an empty queue tree, every job offline-training, no tide
rules) and the feedback loop off.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta

import numpy as np

from tide.core.cluster import Cluster
from tide.core.cycle import CycleState, plan_cycle
from tide.core.feedback import after_clean_run, after_oom, resubmission
from tide.core.frag import FragModel, TypicalPods
from tide.core.job_placement import PodPlacement, job_demand, pod_name, pod_request
from tide.core.lifecycle import mark_pod_exited, mark_pod_started, reset_pod
from tide.core.model import Allocation
from tide.core.placer import Placer
from tide.core.queues import QueueTree
from tide.core.tides import parse_tides
from tide.schemas.events import ExitReason, JobRecord, JobState, PodExited, PodRecord, PodState
from tide.schemas.feedback import FamilyWeights, family_of
from tide.schemas.job import JobSpec
from tide.sim.replay_workload import ReplayJob, Workload
from tide.sim.simulator import fragmentation

EPOCH = datetime(2026, 1, 5)  # midnight of the first virtual day (a Monday); time 0 is start_hour after it
MAX_RESUBMITS = 3


@dataclass(frozen=True)
class Capabilities:
    name: str
    policy: str = "tide"
    sharing: bool = True
    gangs: bool = True
    scheduling: bool = True  # queues + priority classes + preemption + tides
    feedback: bool = True


LADDER: tuple[Capabilities, ...] = (
    Capabilities("FIFO + first-fit, whole GPUs", "firstfit", False, False, False, False),
    Capabilities("+ GPU sharing", "firstfit", True, False, False, False),
    Capabilities("+ bin-packing (bestfit)", "bestfit", True, False, False, False),
    Capabilities("+ fragmentation-aware (tide policy)", "tide", True, False, False, False),
    Capabilities("+ gang + topology", "tide", True, True, False, False),
    Capabilities("+ queues, preemption, tides", "tide", True, True, True, False),
    Capabilities("full Tide (+ feedback loop)", "tide", True, True, True, True),
)
FULL = LADDER[-1]


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class _Job:
    """Replay bookkeeping next to the JobRecord (what the real pod would do)."""

    source: ReplayJob
    remaining: float  # seconds of work left
    arrival: float
    group: str | None = None  # gang-off: the gang this pod belongs to
    waited: float = 0.0
    queued_since: float = 0.0
    resubmits: int = 0
    running_since: float | None = None  # useful work started (gang-off: when the whole group runs)
    work_milli: int = 0  # milli-GPU of work while it runs: what the job asked for (not what a rung rounded it to)


@dataclass
class ReplayResult:
    capabilities: dict
    seed: int
    horizon_s: float
    gpus: int
    totals: dict
    series: dict
    wall_s: float

    def to_dict(self) -> dict:
        return asdict(self)


class Replay:
    def __init__(self, workload: Workload, caps: Capabilities = FULL, bins: int = 200, tick_s: float = 30.0) -> None:
        self.w = workload
        self.tick = tick_s
        self.caps = caps
        self.nodes = workload.nodes
        self.cluster = Cluster.from_descriptions(self.nodes)
        self.capacity = self.cluster.gpu_capacity_milli
        self.device_mib = {n.node_id: {g.index: g.memory_mib for g in n.gpus} for n in self.nodes}
        self.placer = Placer(policy=caps.policy)
        config = workload.queue_config if caps.scheduling else None
        self.tree = QueueTree.from_config({"queues": config["queues"]} if config else None)
        self.tides = parse_tides(config) if config else []
        self.records: dict[str, JobRecord] = {}
        self.jobs: dict[str, _Job] = {}
        self.pending: dict[str, JobRecord] = {}
        self.running: dict[str, tuple[JobRecord, list[Allocation]]] = {}
        self.extra_allocs: dict[str, dict[int, Allocation]] = {}  # job -> pod index -> elastic extra
        self.groups: dict[str, list[str]] = {}
        self.weights: dict[str, FamilyWeights] = {}
        self.events: list[tuple[float, int, str, str, int]] = []
        self.seq = 0
        self.horizon = workload.horizon_s
        self.start_s = workload.config.start_hour * 3600
        self.bins = bins
        self.edges = np.linspace(0.0, self.horizon, bins + 1) if self.horizon > 0 else np.array([0.0, 1.0])
        self.alloc_area = np.zeros(len(self.edges) - 1)
        self.useful_area = np.zeros(len(self.edges) - 1)
        self.frag = np.zeros(len(self.edges) - 1)
        self.useful_milli = 0
        self.last_t = 0.0
        self.next_bin = 0
        typical = TypicalPods.from_requests([pod_request(j.spec) for j in workload.jobs]) if workload.jobs else None
        self.frag_model = FragModel(typical, self.cluster.models) if typical is not None else None
        self.stats = {"preemptions": 0, "preempted_gpu_h_lost": 0.0, "oom_kills": 0, "oom_gpu_h_lost": 0.0,
                      "idle_held_gpu_h": 0.0, "useful_gpu_h": 0.0, "completed": 0, "failed": 0, "cycles": 0}
        self.waits: dict[str, list[float]] = {}
        self.jct: dict[str, list[float]] = {}
        self.gang_waits: list[float] = []

    # ------------------------------------------------------------ events
    def push(self, t: float, kind: str, job_id: str, attempt: int = 0, tick: float | None = None) -> None:
        tick = self.tick if tick is None else tick
        self.seq += 1
        heapq.heappush(self.events, (float(math.ceil(t / tick) * tick), self.seq, kind, job_id, attempt))

    def _spec_for(self, spec: JobSpec) -> JobSpec:
        data = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
        res = data["spec"]["template"]["resources"]
        if not self.caps.sharing and "gpuShare" in res:
            res.pop("gpuShare")
            res["gpu"] = 1
        if not self.caps.scheduling:
            data["metadata"]["priorityClass"] = "offline-training"
        return JobSpec.model_validate(data)

    def submit(self, source: ReplayJob, t: float, spec: JobSpec | None = None, job_id: str | None = None,
               resubmits: int = 0) -> None:
        spec = self._spec_for(spec or source.spec)
        job_id = job_id or source.job_id
        if not self.caps.gangs and spec.spec.gang_size > 1:
            members = []
            data = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
            data["spec"]["replicas"], data["spec"]["topology"] = 1, {}
            data["spec"].pop("minMember", None)
            single = JobSpec.model_validate(data)
            for i in range(spec.spec.gang_size):
                member = f"{job_id}-m{i}"
                members.append(member)
                self._add(member, single, source, t, resubmits, group=job_id)
            self.groups[job_id] = members
            return
        self._add(job_id, spec, source, t, resubmits)

    def _add(self, job_id: str, spec: JobSpec, source: ReplayJob, t: float, resubmits: int,
             group: str | None = None) -> None:
        record = JobRecord(job_id=job_id, spec=spec, submitted_at=t, updated_at=t,
                           pods=[PodRecord(name=f"{job_id}-{i}", index=i) for i in range(spec.spec.replicas)])
        self.records[job_id] = record
        work = round(job_demand(source.spec)["gpu"] * 1000 / source.gang)  # per pod of the original job
        self.jobs[job_id] = _Job(source, source.duration, t, group, queued_since=t, resubmits=resubmits,
                                 work_milli=work * (1 if group else source.gang))
        self.pending[job_id] = record
        self._timeout_check(record, t)

    def _timeout_check(self, record: JobRecord, t: float) -> None:
        """A cycle just after a pending gang's gangTimeoutSeconds runs out (the plan fails or shrinks it)."""
        body = record.spec.spec
        if body.gang_timeout_s is not None and body.gang_size > 1:
            self.push(t + body.gang_timeout_s + 1e-3, "timeout", record.job_id)

    # ------------------------------------------------------------ the loop
    def run(self) -> ReplayResult:
        t0 = time.perf_counter()
        for job in self.w.jobs:
            # the placer is kicked on every submission: serving arrivals get a cycle within the second
            self.push(job.arrival, "arrive", job.job_id, tick=1.0 if job.priority_class == "online-serving" else None)
        by_id = {j.job_id: j for j in self.w.jobs}
        if self.tides:
            day = -1
            while day * 86400 - self.start_s <= self.horizon:
                for rule in self.tides:
                    for clock in (rule.start, rule.end):
                        edge = day * 86400 + clock.hour * 3600 + clock.minute * 60 - self.start_s
                        for at in (edge, edge - rule.return_before_s) if clock == rule.end else (edge,):
                            if at >= 0:
                                self.push(at, "tide", "")
                day += 1
        while self.events and self.events[0][0] <= self.horizon:
            t = self.events[0][0]
            self._advance(t)
            while self.events and self.events[0][0] == t:
                _, _, kind, job_id, attempt = heapq.heappop(self.events)
                if kind == "arrive":
                    self.submit(by_id[job_id], t)
                elif kind == "done":
                    self._finish(job_id, attempt, oom=False)
                elif kind == "oom":
                    self._finish(job_id, attempt, oom=True)
                elif kind == "gone":
                    self._requeue(job_id, attempt)
            self._cycle()
        self._advance(self.horizon)
        for job_id, (_, allocs) in self.running.items():  # gang-off pods still waiting for the rest of their gang
            job = self.jobs[job_id]
            if job.group is not None and job.running_since is not None and not self._group_running(job.group):
                milli = sum(sum(a.gpu_milli) for a in allocs)
                self.stats["idle_held_gpu_h"] += milli / 1000 * (self.horizon - job.running_since) / 3600
        return self._result(time.perf_counter() - t0)

    def _advance(self, t: float) -> None:
        """Integrate allocation and useful work from the last event to ``t``; sample fragmentation at bin edges."""
        while self.last_t < t:
            b = min(int(np.searchsorted(self.edges, self.last_t, side="right")) - 1, len(self.alloc_area) - 1)
            end = min(t, self.edges[b + 1]) if b + 1 < len(self.edges) else t
            if end <= self.last_t:
                end = t
            span = end - self.last_t
            self.alloc_area[b] += self.cluster.allocated_gpu_milli() * span
            self.useful_area[b] += self.useful_milli * span
            self.last_t = end
            if self.next_bin <= b and self.frag_model is not None:
                self.frag[b] = fragmentation(self.cluster, self.frag_model)[0]
                self.next_bin = b + 1

    def _cycle(self) -> None:
        if not self.pending and not self.tides:
            return
        self.stats["cycles"] += 1
        state = CycleState(nodes=self.nodes, cluster=self.cluster, pending=list(self.pending.values()),
                           running=self.running, tree=self.tree, tides=self.tides, weights=self.weights,
                           now=self.last_t, wall=EPOCH + timedelta(seconds=self.start_s + self.last_t),
                           extra_allocs=self.extra_allocs)
        plan = plan_cycle(state, self.placer)
        t = self.last_t
        for out in plan.timed_out:
            record = self.records[out.record.job_id]
            record.reason = out.reason
            if out.action == "fail":
                record.state, record.finished_at = JobState.FAILED, t
                self.pending.pop(record.job_id, None)
                self.stats["failed"] += 1
            elif out.spec is not None:
                record.spec = out.spec
        for p in plan.preemptions:
            if p.pods:
                self._preempt_extras(p.job_id, p.pods)
                continue
            self._preempt(p.job_id, p.by, p.why, t)
        for job_id, reason in plan.nominations.items():
            record = self.records[job_id]
            record.nominated_at, record.reason = t, reason
        for record, unfit in plan.not_placed:
            record.state = JobState.PENDING if unfit.resolvable else JobState.UNSCHEDULABLE
            record.reason = unfit.reason
        for bind in plan.binds:
            self._bind(self.records[bind.record.job_id], bind.placements, t)
        for grow in plan.grows:
            record = self.records[grow.record.job_id]
            self._place_pods(record, grow.placements)
            self.running[record.job_id] = (record, [*self.running[record.job_id][1],
                                                    *(p.alloc for p in grow.placements)])

    # ------------------------------------------------------------ carrying out the plan
    def _place_pods(self, record: JobRecord, placements: list[PodPlacement]) -> None:
        """Put pods on their nodes and start them (the record gains the elastic extras it lacks)."""
        have = {p.index for p in record.pods}
        record.pods.extend(PodRecord(name=pod_name(record.job_id, p.pod_index), index=p.pod_index)
                           for p in placements if p.pod_index not in have)
        record.pods.sort(key=lambda p: p.index)
        by_index = {p.index: p for p in record.pods}
        gang = record.spec.spec.gang_size
        for p in placements:
            by_index[p.pod_index].node = p.alloc.node_id
            self.cluster.allocate(p.alloc)
            if p.pod_index >= gang:
                self.extra_allocs.setdefault(record.job_id, {})[p.pod_index] = p.alloc
            mark_pod_started(record, by_index[p.pod_index].name)

    def _preempt_extras(self, job_id: str, pods: tuple[int, ...]) -> None:
        """A pod-level preemption: the extras give their GPUs back at once and want placement again."""
        record, allocs = self.running[job_id]
        held = self.extra_allocs.get(job_id, {})
        allocs = list(allocs)
        for index in pods:
            alloc = held.pop(index, None)
            if alloc is None:
                continue
            allocs.remove(alloc)
            self.cluster.release(alloc)
            reset_pod(next(p for p in record.pods if p.index == index))
        self.running[job_id] = (record, allocs)
        self.stats["preemptions"] += 1

    def _bind(self, record: JobRecord, placements: list[PodPlacement], t: float) -> None:
        job = self.jobs[record.job_id]
        record.attempts += 1
        record.nominated_at = None
        allocs = [p.alloc for p in placements]
        self._place_pods(record, placements)
        if record.state == JobState.RUNNING:
            record.started_at = t
        self.pending.pop(record.job_id, None)
        self.running[record.job_id] = (record, allocs)
        job.waited += t - job.queued_since
        milli = sum(sum(a.gpu_milli) for a in allocs)
        if job.group is None:
            self._start_work(record.job_id, t, milli)
            if record.attempts == 1 and record.spec.spec.gang_size > 1:
                self.gang_waits.append(job.waited)
            return
        members = self.groups[job.group]
        if all(self.records[m].job_id in self.running for m in members):
            for m in members:
                self._start_work(m, t, sum(sum(a.gpu_milli) for a in self.running[m][1]))
            self.gang_waits.append(t - job.arrival)
        else:
            job.running_since = t  # holds its GPUs idle until the whole group runs

    def _start_work(self, job_id: str, t: float, milli: int) -> None:
        job, record = self.jobs[job_id], self.records[job_id]
        if job.group is not None and job.running_since is not None:
            self.stats["idle_held_gpu_h"] += milli / 1000 * (t - job.running_since) / 3600
        job.running_since = t
        self.useful_milli += job.work_milli
        if job.source.need_mib is not None and job.group is None:
            allocs = self.running[job_id][1]
            given = min(a.gpu_mem_mib[0] for a in allocs if a.gpu_mem_mib)
            if given < job.source.need_mib:
                self.push(t + job.remaining * job.source.oom_fraction, "oom", job_id, record.attempts)
                return
        self.push(t + job.remaining, "done", job_id, record.attempts)

    def _stop_work(self, job_id: str, t: float, useful: bool | None = None) -> float:
        """Release a running job's claims; returns the seconds it ran usefully."""
        job = self.jobs[job_id]
        if useful is None:
            useful = job.group is None or self._group_running(job.group)
        record, allocs = self.running.pop(job_id)
        self.extra_allocs.pop(job_id, None)
        for alloc in allocs:
            self.cluster.release(alloc)
        ran = 0.0
        if job.running_since is not None and useful:
            ran = t - job.running_since
            self.useful_milli -= job.work_milli
        job.running_since = None
        return ran

    def _group_running(self, group: str) -> bool:
        return all(self.jobs[m].running_since is not None and m in self.running for m in self.groups[group])

    def _finish(self, job_id: str, attempt: int, oom: bool) -> None:
        record = self.records[job_id]
        if record.attempts != attempt or record.state != JobState.RUNNING:
            return
        t = self.last_t
        job = self.jobs[job_id]
        members = self.groups[job.group] if job.group else [job_id]
        gpus = sum(sum(sum(a.gpu_milli) for a in self.running[m][1]) for m in members) / 1000
        work = sum(self.jobs[m].work_milli for m in members) / 1000
        for m in members:
            rec = self.records[m]
            node = self.running[m][1][0].node_id if self.running[m][1] else ""
            for pod in rec.pods:
                exited = PodExited(node_id=node, job_id=m, pod=pod.name, exit_code=137 if oom else 0,
                                   reason=ExitReason.OOM if oom else ExitReason.COMPLETED)
                if mark_pod_exited(rec, exited)[0] is not None:
                    rec.finished_at = t
        useful = job.group is None or self._group_running(job.group)
        ran = 0.0
        for m in members:
            ran = max(ran, self._stop_work(m, t, useful))
        klass = job.source.priority_class
        if not oom:
            self.stats["completed"] += 1
            self.stats["useful_gpu_h"] += work * ran / 3600
            self.jct.setdefault(klass, []).append(t - job.arrival)
            self.waits.setdefault(klass, []).append(job.waited)
            if self.caps.feedback and job.source.need_mib is not None:
                family = family_of(record.spec)
                w = after_clean_run(self.weights.get(family), job_id=job_id, now=t)
                if w is not None:
                    self.weights[family] = w
            return
        self.stats["oom_kills"] += 1
        self.stats["oom_gpu_h_lost"] += gpus * ran / 3600
        self.waits.setdefault(klass, []).append(job.waited)
        self._resubmit(job_id, t)

    def _resubmit(self, job_id: str, t: float) -> None:
        record, job = self.records[job_id], self.jobs[job_id]
        if job.resubmits >= MAX_RESUBMITS:
            self.stats["failed"] += 1
            return
        new_id = f"{job.source.job_id}-r{job.resubmits + 1}"
        spec = record.spec
        if self.caps.feedback:
            family = family_of(spec)
            share = spec.spec.template.resources.gpu_share
            node = record.pods[0].node or ""
            device = max(self.device_mib.get(node, {0: 0}).values())
            self.weights[family] = after_oom(self.weights.get(family), family, job_id=job_id,
                                             request_mib=share.memory_mib if share else None, device_mib=device,
                                             now=t)
            again = resubmission(job_id, spec, self.weights[family].memory_multiplier, device)
            if again is not None:
                spec = JobSpec.model_validate(again[1])
        job.source = replace(job.source)  # the same work and need, a new job
        self.submit(job.source, t, spec=spec, job_id=new_id, resubmits=job.resubmits + 1)
        self.jobs[new_id].arrival = job.arrival

    def _preempt(self, job_id: str, by: str, why: str, t: float) -> None:
        record = self.records[job_id]
        if record.state != JobState.RUNNING:
            return
        record.state, record.reason, record.preempted_by = JobState.PREEMPTED, f"preempted by {by} ({why})", by
        record.preemptions += 1
        self.stats["preemptions"] += 1
        grace = record.spec.spec.grace_period_s
        self.push(t + grace, "gone", job_id, record.attempts)

    def _requeue(self, job_id: str, attempt: int) -> None:
        record = self.records[job_id]
        if record.state != JobState.PREEMPTED or record.attempts != attempt:
            return
        t = self.last_t
        job = self.jobs[job_id]
        gpus = sum(sum(a.gpu_milli) for a in self.running[job_id][1]) / 1000
        ran = self._stop_work(job_id, t)
        kept = math.floor(ran / self.w.config.checkpoint_s) * self.w.config.checkpoint_s
        job.remaining = max(job.remaining - kept, 1.0)
        self.stats["preempted_gpu_h_lost"] += gpus * (ran - kept) / 3600
        record.state, record.reason = JobState.PENDING, f"requeued after preemption by {record.preempted_by}"
        record.queued_at = t
        self._timeout_check(record, t)
        for p in record.pods:
            p.node, p.gpus, p.state, p.exit_code, p.reason = None, [], PodState.PENDING, None, None
        record.last_checkpoint_at = (record.started_at or t) + kept
        job.queued_since = t
        self.pending[job_id] = record

    # ------------------------------------------------------------ results
    def _result(self, wall_s: float) -> ReplayResult:
        widths = np.diff(self.edges)
        cap = float(self.capacity)
        alloc_pct = 100.0 * self.alloc_area / (cap * widths)
        useful_pct = 100.0 * self.useful_area / (cap * widths)
        offered = offered_load(self.w.jobs, self.edges) * 1000.0 / cap * 100.0
        saturated = offered >= 100.0
        span = self.horizon
        waits = {k: {"n": len(v), "p50": _pct(v, 50), "p95": _pct(v, 95), "p99": _pct(v, 99)}
                 for k, v in sorted(self.waits.items())}
        jct = {k: {"n": len(v), "p50": _pct(v, 50), "p95": _pct(v, 95)} for k, v in sorted(self.jct.items())}
        pending_demand = sum(job_demand(r.spec)["gpu"] for r in self.pending.values())
        totals = {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in self.stats.items()},
            "gpu_alloc_pct": float(self.alloc_area.sum() / (cap * span) * 100.0) if span else 0.0,
            "useful_pct": float(self.useful_area.sum() / (cap * span) * 100.0) if span else 0.0,
            "saturated_bins": int(saturated.sum()),
            "gpu_alloc_saturated_pct": float(alloc_pct[saturated].mean()) if saturated.any() else None,
            "frag_pct_mean": float(self.frag.mean()),
            "queueing_delay_s": waits,
            "jct_s": jct,
            "gang_wait_s": {"n": len(self.gang_waits), "p50": _pct(self.gang_waits, 50),
                            "p95": _pct(self.gang_waits, 95)},
            "pending_at_end": len(self.pending),
            "pending_gpus_at_end": round(pending_demand, 2),
        }
        series = {"t_h": [round(float(x) / 3600, 3) for x in (self.edges[:-1] + widths / 2)],
                  "alloc_pct": [round(float(x), 2) for x in alloc_pct],
                  "useful_pct": [round(float(x), 2) for x in useful_pct],
                  "offered_pct": [round(float(x), 2) for x in offered],
                  "frag_pct": [round(float(x), 2) for x in self.frag]}
        return ReplayResult(asdict(self.caps), self.w.config.seed, self.horizon, self.capacity // 1000, totals,
                            series, round(wall_s, 2))


def offered_load(jobs: list[ReplayJob], edges: np.ndarray) -> np.ndarray:
    """GPUs the workload asks for in each bin if every job started on arrival (time-weighted mean)."""
    if not jobs:
        return np.zeros(len(edges) - 1)
    start = np.array([j.arrival for j in jobs])
    end = start + np.array([j.duration for j in jobs])
    gpus = np.array([job_demand(j.spec)["gpu"] for j in jobs])
    lo, hi = edges[:-1][None, :], edges[1:][None, :]
    overlap = np.clip(np.minimum(end[:, None], hi) - np.maximum(start[:, None], lo), 0, None)
    return (gpus[:, None] * overlap).sum(axis=0) / np.diff(edges)


def replay(workload: Workload, caps: Capabilities = FULL, bins: int = 200, tick_s: float = 30.0) -> ReplayResult:
    return Replay(workload, caps, bins, tick_s).run()
