"""The feedback loop's I/O: read a finished job and its measurements, ask ``tide.core.feedback`` what to
change, persist it in ``tide:placer:weights``, publish ``WeightsChanged`` and resubmit OOM-failed jobs.

Idempotent under redelivery: a change and the marker ``tide:feedback:done:<job>:<kind>`` are written in
one Redis transaction, so a redelivered event changes nothing twice; the resubmission has a
deterministic job id and ``Nats-Msg-Id`` and is skipped when that job exists.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry import trace
from redis.asyncio import Redis
from redis.exceptions import WatchError
from tide import subjects
from tide.bus.nats import publish
from tide.core.feedback import (
    FeedbackPolicy,
    JobGpu,
    PodBytes,
    after_clean_run,
    after_oom,
    after_traffic,
    applied_multiplier,
    far_traffic_bytes,
    may_change_affinity,
    resubmission,
    share_memory_mib,
)
from tide.schemas.events import JobRecord, PodUsage, SubmitJob, parse_agent_pod_id
from tide.schemas.feedback import FamilyWeights, WeightsChanged, family_of
from tide.schemas.job import JobSpec
from tide.schemas.node import NodeDescription
from tide.settings import Settings
from tide.store import keys
from tide.store.jobs import JobStore
from tide.tracing import job_span

log = structlog.get_logger()
tracer = trace.get_tracer("tide.metrics")
MARKER_TTL_S = 7 * 24 * 3600


HISTORY = keys.FEEDBACK_LOG  # list, newest first: every change with its evidence
HISTORY_LEN = 500
TENANT_JOBS_WINDOW = 1000  # a tenant's families: those of its jobs among this many most recent (as the queue's list)
EVIDENCE_WITHHELD = "(withheld: the last change came from a job that is not known to be yours)"


def marker(job_id: str, kind: str) -> str:
    return keys.feedback_done(job_id, kind)


def policy_from(settings: Settings) -> FeedbackPolicy:
    return FeedbackPolicy(
        oom_step=settings.feedback_oom_step,
        max_multiplier=settings.feedback_max_multiplier,
        decay_after=settings.feedback_decay_after,
        decay=settings.feedback_decay,
        traffic_bytes_per_s=settings.feedback_traffic_bytes_per_s,
        affinity_step=settings.feedback_affinity_step,
        max_resubmits=settings.feedback_max_resubmits,
    )


def weights_request(data: bytes | None) -> tuple[str | None, int]:
    """A weights API request's ``(family, limit)``: ``{}`` or ``{"family": "x", "limit": 20}``; anything else
    in it is ignored (a family that is not a string: every family; a limit that is not a number: 20; a limit is
    kept within 0 and ``HISTORY_LEN``)."""
    try:
        req = json.loads(data) if data else {}
    except ValueError:
        req = {}
    if not isinstance(req, dict):
        req = {}
    family = req.get("family")
    try:
        limit = int(req.get("limit", 20))
    except (TypeError, ValueError, OverflowError):
        limit = 20
    return (family if isinstance(family, str) else None), max(0, min(limit, HISTORY_LEN))


def tenant_weights(
    weights: Mapping[str, FamilyWeights], history: Sequence[dict[str, Any]], owners: Mapping[str, str | None],
    own_families: Iterable[str], tenant: str, family: str | None = None, limit: int = 20,
) -> dict[str, Any]:
    """What ``tenant`` may see of the weights API (``tide.api.weights.<tenant>``; docs/security.md).

    ``history`` is the feedback log (newest first), ``owners`` the owner of each job id in it that has a record
    (None: the admin's), ``own_families`` the families of the tenant's own jobs. The tenant sees the history
    entries of its own jobs (each entry's evidence names only its own job) and the weights of the families of its
    own jobs; a family's ``evidence`` (its last change, which names the job that caused it) only when it is the
    evidence of one of those entries, else ``EVIDENCE_WITHHELD``. No other job id than its own appears."""
    mine = [e for e in history if isinstance(e.get("job_id"), str) and owners.get(e["job_id"]) == tenant]
    visible = set(own_families) | {e.get("family") for e in mine}
    if family is not None:
        visible &= {family}
    own_evidence = {(e.get("family"), e.get("evidence")) for e in mine}
    families = []
    for name in sorted(f for f in visible if isinstance(f, str) and f in weights):
        w = weights[name]
        if w.evidence and (name, w.evidence) not in own_evidence:
            w = w.model_copy(update={"evidence": EVIDENCE_WITHHELD})
        families.append(w.model_dump())
    return {"families": families, "history": [e for e in mine if e.get("family") in visible][:max(0, limit)]}


@dataclass
class PodSeen:
    node: str
    usage: PodUsage
    first_ts: float
    last_ts: float


@dataclass
class JobUsage:
    """What telemetry said about one job's pods (cumulative bytes, peaks)."""

    pods: dict[str, PodSeen] = field(default_factory=dict)  # pod name -> the latest attempt's usage
    attempt: int = 0

    def add(self, node: str, usage: PodUsage, ts: float) -> None:
        """Agents name pods ``<pod>.a<attempt>``; only the latest attempt counts."""
        name, attempt = parse_agent_pod_id(usage.pod)
        if attempt < self.attempt:
            return
        if attempt > self.attempt:
            self.pods.clear()
            self.attempt = attempt
        seen = self.pods.get(name)
        if seen is None:
            self.pods[name] = PodSeen(node, usage, ts, ts)
        else:
            seen.node, seen.usage, seen.last_ts = node, usage, ts

    @property
    def peak_bytes(self) -> int:
        return max((p.usage.peak_memory_bytes for p in self.pods.values()), default=0)

    @property
    def last_ts(self) -> float:
        return max((p.last_ts for p in self.pods.values()), default=0.0)


def gpu_positions(record: JobRecord, nodes: dict[str, NodeDescription], usage: JobUsage | None) -> list[JobGpu]:
    """Where the job's GPUs were: from its record (pod -> node, GPU UUIDs) and the nodes' inventories."""
    out: list[JobGpu] = []
    for pod in record.pods:
        node_id = pod.node or (usage.pods[pod.name].node if usage and pod.name in usage.pods else None)
        if node_id is None:
            continue
        node = nodes.get(node_id)
        by_uuid = {g.uuid: g for g in node.gpus} if node else {}
        if not pod.gpus:
            out.append(JobGpu(pod.name, node_id))
        for uuid in pod.gpus:
            g = by_uuid.get(uuid.split("/")[0].removeprefix("MIG-"))  # a MIG placeholder names its GPU
            if g is None:
                out.append(JobGpu(pod.name, node_id))
                continue
            group = g.nvlink_domain if g.nvlink_domain is not None else (
                min([g.index, *g.nvlink_peers]) + 1000 if g.nvlink_peers else None)
            out.append(JobGpu(pod.name, node_id, g.index, g.pcie_switch, group))
    return out


def device_mib(record: JobRecord, nodes: dict[str, NodeDescription]) -> int | None:
    """The memory of the GPU(s) the job's pods ran on (the smallest, for the cap)."""
    sizes = []
    for pod in record.pods:
        node = nodes.get(pod.node or "")
        if node is None:
            continue
        by_uuid = {g.uuid: g.memory_mib for g in node.gpus}
        sizes += [by_uuid[u] for u in pod.gpus if u in by_uuid]
        if not pod.gpus:
            sizes += [g.memory_mib for g in node.gpus]
    return min(sizes) if sizes else None


class FeedbackLoop:
    def __init__(self, settings: Settings, redis: Redis, nc: NATS, js: JetStreamContext,
                 on_change: Callable[[FamilyWeights, str], None] | None = None,
                 on_resubmit: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.policy = policy_from(settings)
        self.redis = redis
        self.nc = nc
        self.js = js
        self.on_change = on_change or (lambda w, kind: None)
        self.on_resubmit = on_resubmit or (lambda family: None)
        self.jobs = JobStore(redis)

    # ------------------------------------------------------------ reads
    async def record(self, job_id: str) -> JobRecord | None:
        raw = await self.redis.get(keys.job(job_id))
        return JobRecord.model_validate_json(raw) if raw else None

    async def nodes_of(self, record: JobRecord) -> dict[str, NodeDescription]:
        ids = sorted({p.node for p in record.pods if p.node})
        raws = [await self.redis.get(keys.node(n)) for n in ids]
        return {n: NodeDescription.model_validate_json(r) for n, r in zip(ids, raws, strict=True) if r}

    async def weights(self, family: str | None = None) -> dict[str, FamilyWeights]:
        if family is not None:
            raw = await self.redis.hget(keys.WEIGHTS, family)
            return {family: FamilyWeights.model_validate_json(raw)} if raw else {}
        return {f: FamilyWeights.model_validate_json(r) for f, r in (await self.redis.hgetall(keys.WEIGHTS)).items()}

    # ------------------------------------------------------------ writes
    async def _change(
        self, family: str, job_id: str, kind: str, decide: Callable[[FamilyWeights | None], FamilyWeights | None]
    ) -> FamilyWeights | None:
        """Apply ``decide`` to the family's weights atomically, once per (job, kind); publish what changed."""
        done = marker(job_id, kind)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(keys.WEIGHTS, done)
                    if await pipe.exists(done):
                        await pipe.reset()
                        return None
                    raw = await pipe.hget(keys.WEIGHTS, family)
                    new = decide(FamilyWeights.model_validate_json(raw) if raw else None)
                    pipe.multi()
                    pipe.set(done, "1", ex=MARKER_TTL_S)
                    if new is not None:
                        pipe.hset(keys.WEIGHTS, family, new.model_dump_json())
                        entry = {"ts": new.updated_at, "family": family, "kind": kind, "job_id": job_id,
                                 "memory_multiplier": new.memory_multiplier, "affinity": new.affinity,
                                 "evidence": new.evidence}
                        pipe.lpush(HISTORY, json.dumps(entry))
                        pipe.ltrim(HISTORY, 0, HISTORY_LEN - 1)
                    await pipe.execute()
                    break
                except WatchError:
                    continue
        if new is None:
            return None
        log.info("feedback_adjusted", job_id=job_id, family=family, kind=kind, evidence=new.evidence,
                 memory_multiplier=new.memory_multiplier, affinity=new.affinity, clean_runs=new.clean_runs)
        await self.nc.publish(subjects.PLACER_WEIGHTS, WeightsChanged(weights=new).to_bytes())
        self.on_change(new, kind)
        return new

    # ------------------------------------------------------------ decisions
    async def job_failed_oom(self, job_id: str, usage: JobUsage | None) -> None:
        record = await self.record(job_id)
        if record is None:
            return
        spec = record.spec
        family = family_of(spec)
        nodes = await self.nodes_of(record)
        dev = device_mib(record, nodes)
        share = share_memory_mib(spec)
        original = int(round(share / applied_multiplier(spec))) if share else None
        with job_span(tracer, "feedback.oom", job_id, family=family):
            w = await self._change(family, job_id, "oom", lambda cur: after_oom(
                cur, family, job_id=job_id, request_mib=original, device_mib=dev,
                peak_bytes=usage.peak_bytes if usage else None, policy=self.policy))
            if w is None:
                w = (await self.weights(family)).get(family)
            if w is not None:
                await self.resubmit(record, w, dev)

    async def resubmit(self, record: JobRecord, w: FamilyWeights, dev: int | None) -> None:
        plan = resubmission(record.job_id, record.spec, w.memory_multiplier, dev, self.policy)
        if plan is None:
            log.info("feedback_no_resubmit", job_id=record.job_id, family=w.family,
                     reason="not a GPU share, no larger share possible, or resubmitted too often")
            return
        new_id, body, why = plan
        if await self.redis.exists(keys.job(new_id)):
            return
        message = SubmitJob(event_id=f"resubmit-{new_id}", job_id=new_id, spec=JobSpec.model_validate(body))
        # a tenant's job is resubmitted as that tenant (its subject): the resubmission keeps the owner, so the
        # tenant sees and cancels it, and the queue checks it against the tenant's queues, class and limits
        subject = subjects.job_submit_as(record.owner) if record.owner else subjects.JOB_SUBMIT
        await publish(self.js, subject, message)
        log.info("feedback_resubmitted", job_id=record.job_id, new_job_id=new_id, family=w.family, evidence=why,
                 tenant=record.owner)
        self.on_resubmit(w.family)

    async def job_succeeded(self, job_id: str, usage: JobUsage | None, spec: JobSpec | None = None) -> None:
        """A clean run decays its family's multiplier; ``spec`` (when the caller has it) saves a record read."""
        if spec is None:
            record = await self.record(job_id)
            if record is None:
                return
            spec = record.spec
        family = family_of(spec)
        if not await self.redis.hexists(keys.WEIGHTS, family):
            return
        share = share_memory_mib(spec)
        original = int(round(share / applied_multiplier(spec))) if share else None
        await self._change(family, job_id, "clean", lambda cur: after_clean_run(
            cur, job_id=job_id, request_mib=original, peak_bytes=usage.peak_bytes if usage else None,
            policy=self.policy))

    async def job_traffic(self, job_id: str, usage: JobUsage, spec: JobSpec | None = None) -> None:
        """A finished job's traffic, weighed for its family's affinity. ``spec``, where known, spares the reads of
        a job whose traffic cannot change it (``may_change_affinity``: one pod on one GPU, most inference jobs)."""
        if spec is not None and not may_change_affinity(spec, self.policy):
            return
        record = await self.record(job_id)
        if record is None or not usage.pods:
            return
        family = family_of(record.spec)
        nodes = await self.nodes_of(record)
        gpus = gpu_positions(record, nodes, usage)
        far = far_traffic_bytes(gpus, [PodBytes(p, s.usage.pcie_bytes, s.usage.network_bytes)
                                       for p, s in usage.pods.items()])
        if record.started_at and record.finished_at:
            seconds = record.finished_at - record.started_at
        else:
            seconds = usage.last_ts - min(s.first_ts for s in usage.pods.values())
        spread = len({g.node for g in gpus})
        await self._change(family, job_id, "traffic", lambda cur: after_traffic(
            cur, family, job_id=job_id, far_bytes=far, seconds=seconds, nodes=spread, policy=self.policy))

    async def history(self, family: str | None = None, limit: int = 20) -> list[dict]:
        out = []
        for raw in await self.redis.lrange(HISTORY, 0, HISTORY_LEN - 1):
            entry = json.loads(raw)
            if family is None or entry["family"] == family:
                out.append(entry)
                if len(out) >= limit:
                    break
        return out

    async def api_weights(self, family: str | None, limit: int = 20) -> dict:
        """``{"families": [FamilyWeights...], "history": [{ts, family, kind, job_id, ..., evidence}...]}``."""
        weights = await self.weights(family)
        return {"families": [w.model_dump() for _, w in sorted(weights.items())],
                "history": await self.history(family, limit), "ts": time.time()}

    async def api_weights_for(self, tenant: str, family: str | None, limit: int = 20) -> dict[str, Any]:
        """The weights API on ``tide.api.weights.<tenant>``: what ``tenant_weights`` lets the tenant see, from the
        weights, the feedback log, the owners of the jobs in it and the tenant's most recent jobs."""
        weights = await self.weights(family)
        history = [json.loads(raw) for raw in await self.redis.lrange(HISTORY, 0, HISTORY_LEN - 1)]
        ids = sorted({e["job_id"] for e in history if isinstance(e.get("job_id"), str)})
        owners = {r.job_id: r.owner for r in await self.jobs.get_many(ids) if r is not None}
        own_families = {family_of(r.spec) for r in await self.jobs.recent(TENANT_JOBS_WINDOW) if r.owner == tenant}
        return tenant_weights(weights, history, owners, own_families, tenant, family, limit) | {"ts": time.time()}
