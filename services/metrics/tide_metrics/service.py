"""The metrics service: job events, telemetry and Redis state in; Prometheus metrics (OpenTelemetry SDK),
job-path traces and the feedback loop out.

Inputs: the ``EVENTS`` stream (durable ``metrics-events``) and the digests of the other events, the agents'
telemetry (a plain subscription on a connection of its own, read in batches) and, every
``TIDE_METRICS_POLL_S``, Redis (nodes, capacity/used hashes, claims, the pending set and job records, the
feedback weights). The computations are pure
(``tide_metrics.state``, ``tide.core.feedback``); this module is the I/O around them. Metric names
and meanings: ``docs/observability.md``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
import yaml
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import REGISTRY, start_http_server
from redis.asyncio import Redis
from tide import subjects
from tide.batch import Batcher
from tide.bus.nats import close_nats, connect, consume, ensure_streams
from tide.bus.paced import PacedConnection
from tide.runtime import every
from tide.schemas.events import GpuSample, JobEvent, JobEventDigest, JobRecord, Telemetry
from tide.schemas.feedback import FamilyWeights, family_of
from tide.schemas.job import JobSpec
from tide.schemas.node import NodeDescription
from tide.settings import Settings
from tide.store import keys
from tide.store.redis import redis_for
from tide.store.usage import UsageReader
from tide.tracing import spans_wanted

from tide_metrics import dcgm, state
from tide_metrics.dead_letters import DeadLetterCounter
from tide_metrics.feedback import FeedbackLoop, JobUsage, weights_request
from tide_metrics.traces import TERMINAL_KINDS, Timeline, emit

log = structlog.get_logger()
WAIT_BUCKETS_S = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600]
LATENCY_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
SAMPLE_STALE_S = 60.0
JOB_CACHE = 20_000
NODES_RESYNC_S = 60.0  # node descriptions are read again at least this often


@dataclass
class Snapshot:
    """The cluster as last read from Redis, in the shapes the gauges export."""

    pools: dict[str, str] = field(default_factory=dict)  # node -> pool
    models: dict[tuple[str, int], str] = field(default_factory=dict)  # (node, gpu) -> model
    node_alloc: dict[str, state.Allocated] = field(default_factory=dict)
    pool_alloc: dict[str, state.Allocated] = field(default_factory=dict)
    cluster_alloc: state.Allocated = field(default_factory=state.Allocated)
    frag: dict[str, state.Fragmentation] = field(default_factory=dict)
    pending: dict[tuple[str, str], int] = field(default_factory=dict)
    queue_used: dict[str, float] = field(default_factory=dict)
    lent_borrowed: dict[str, tuple[float, float]] = field(default_factory=dict)
    pool_lending: dict[str, tuple[float, float]] = field(default_factory=dict)
    weights: dict[str, FamilyWeights] = field(default_factory=dict)
    holders: dict[tuple[str, int], tuple[state.Holder, ...]] = field(default_factory=dict)  # (node, gpu) -> pods


@dataclass(frozen=True)
class Inventory:
    version: str | None  # keys.NODES_VERSION when read
    read_at: float  # monotonic
    nodes: dict[str, NodeDescription]
    capacity: dict[str, dict[str, str]]  # node id -> its capacity hash
    pools: dict[str, str]  # node id -> its pool
    models: dict[tuple[str, int], str]  # (node id, GPU index) -> GPU model


@dataclass(frozen=True)
class JobInfo:
    spec: JobSpec
    family: str

    @property
    def gang(self) -> int:
        return self.spec.spec.gang_size


class MetricsService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.gpus: dict[tuple[str, int], tuple[float, GpuSample]] = {}
        self.snapshot = Snapshot()
        self.jobs: dict[str, JobInfo] = {}
        # the jobs whose spec the events of one turn (a digest's) ask for and the cache lacks: one read for all
        self._infos: Batcher[str, JobInfo | None] = Batcher(self._job_infos_in_order)
        self.inventory: Inventory | None = None  # the nodes as last read
        # node id -> (the inventory, the used hash, the free GPUs computed from them): a node whose used hash did
        # not change since the last poll (most of a big cluster's, each poll) is not computed again
        self._free: dict[str, tuple[Inventory, dict[str, str], list[state.FreeGpu]]] = {}
        self._usage: tuple[Redis, UsageReader] | None = None
        self.weights_changed = False  # the feedback loop changed a family's weights since they were read
        self.usage: dict[str, JobUsage] = {}
        self.timelines: dict[str, Timeline] = {}
        self.known_queues: set[tuple[str, str]] = set()
        self.max_clock: dict[tuple[str, int], float] = {}
        self.last_xid: dict[tuple[str, int], int] = {}  # (node, gpu) -> the last XID seen
        self.xid_counts: dict[tuple[str, int, int], int] = {}  # (node, gpu, xid) -> times seen
        self.event_counts: dict[tuple[str, str, str], int] = {}  # (kind, queue, priority class) -> job events
        self.guarantees = self._load_guarantees()
        self.tracer = trace.get_tracer("tide.metrics")

    def _load_guarantees(self) -> dict[str, float]:
        path = self.settings.metrics_queues_file
        if path is None or not path.exists():
            return {}
        return state.load_guarantees(yaml.safe_load(path.read_text()))

    # ------------------------------------------------------------ set-up
    async def start(self) -> None:
        start_http_server(self.settings.metrics_port, addr=self.settings.metrics_host)
        provider = MeterProvider(
            resource=Resource.create({"service.name": "tide-metrics"}), metric_readers=[PrometheusMetricReader()]
        )
        self._instruments(provider.get_meter("tide.metrics"))
        self.dead_letters = DeadLetterCounter(provider.get_meter("tide.metrics"))  # tide_dead_letters_total
        self._dcgm = dcgm.DcgmCollector(self._dcgm_views)  # DCGM_FI_* series beside tide_* (docs/observability.md)
        REGISTRY.register(self._dcgm)
        self.redis: Redis = redis_for(self.settings)
        self.nc = await connect(self.settings, "tide-metrics", inbox_prefix="_INBOX_metrics")  # its own only
        self.js = self.nc.jetstream()
        await ensure_streams(self.js)
        self.feedback = FeedbackLoop(
            self.settings, self.redis, self.nc, self.js,
            on_change=self._weights_changed,
            on_resubmit=lambda family: self.resubmissions.add(1, {"family": family}),
        )
        self._api = await self.nc.subscribe(subjects.API_WEIGHTS, cb=self._on_api_weights)
        # a tenant's weights (tide.api.weights.<tenant>): only the families and history of its own jobs
        self._api_tenants = await self.nc.subscribe(subjects.API_WEIGHTS_TENANTS, cb=self._on_api_weights)
        # Telemetry is a series of samples that the next one supersedes (a pod's usage is cumulative since it
        # started, peak included), so a plain subscription does: no pull requests and no acks, which at 1,000
        # nodes cost more CPU than the rest of the metrics service. A restart misses the samples sent while it
        # was down; the TELEMETRY stream keeps the last hour of them for inspection. On a connection of their own,
        # read in batches (``tide.bus.paced``): one wake-up for the heartbeats of 50 ms, not one for each.
        self._telemetry_conn = await PacedConnection.open(self.settings, "tide-metrics-telemetry",
                                                          self.settings.telemetry_read_every_s)
        self._telemetry = await self._telemetry_conn.subscribe(subjects.TELEMETRY_ALL, self._on_telemetry)
        # Job events: the terminal ones (the feedback loop acts on them: weights, OOM resubmissions) through a
        # durable consumer, so none is missed across a restart; every other kind only counts and times, so the
        # digests the queue and placer send of them do (``tide.events.EventPublisher``: one delivery per digest,
        # not per event; no pull requests, no acks).
        self._events = await self.nc.subscribe(subjects.EVENT_DIGEST, cb=self._on_digest)
        self._event_tails: dict[str, asyncio.Task[None]] = {}
        await self._poll()

    def _weights_changed(self, weights: FamilyWeights, kind: str) -> None:
        self.adjustments.add(1, {"family": weights.family, "kind": kind})
        self.weights_changed = True

    def _instruments(self, meter: Any) -> None:
        # counted here and observed at each collection: an OpenTelemetry counter's add per event (its attributes
        # hashed and checked each time) cost more than the rest of an event's handling (issue 17)
        meter.create_observable_counter("tide_job_events", [self._event_counts], unit="1",
                                        description="job lifecycle events")
        self.queue_wait = meter.create_histogram(
            "tide_queue_wait", unit="s", description="submission to placement, per queue and priority class",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS_S)
        self.gang_wait = meter.create_histogram(
            "tide_gang_wait", unit="s", description="submission to placement of gangs (minMember > 1)",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS_S)
        self.placement_latency = meter.create_histogram(
            "tide_placement_latency", unit="s",
            description="placed to running: reserve, start every pod on its agent, commit",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S)
        self.preemptions = meter.create_counter("tide_preemptions", unit="1", description="jobs preempted")
        self.ooms = meter.create_counter("tide_oom", unit="1", description="pods that died of a GPU OOM")
        self.adjustments = meter.create_counter("tide_feedback_adjustments", unit="1",
                                                description="feedback weight changes by family and cause")
        self.resubmissions = meter.create_counter("tide_feedback_resubmissions", unit="1",
                                                  description="OOM-failed jobs resubmitted with a larger share")
        gauge = meter.create_observable_gauge

        def gpu_metric(name: str, fn: Callable[[str, int, GpuSample], Iterable[tuple[float, dict[str, str]]]],
                       unit: str, description: str) -> None:
            gauge(name, [self._per_gpu(fn)], unit=unit, description=description)

        gpu_metric("tide_gpu_utilization_ratio", lambda n, i, s: [(s.utilization_ratio, {})], "1",
                   "GPU utilisation (0-1)")
        gpu_metric("tide_gpu_memory_used_bytes", lambda n, i, s: [(s.memory_used_bytes, {})], "By", "GPU memory used")
        gpu_metric("tide_gpu_memory_total_bytes", lambda n, i, s: [(s.memory_total_bytes, {})], "By",
                   "GPU memory")
        gpu_metric("tide_gpu_memory_bandwidth_utilization_ratio", lambda n, i, s: [(s.memory_bandwidth_ratio, {})],
                   "1", "GPU memory bandwidth utilisation (0-1)")
        gpu_metric("tide_gpu_pcie_throughput", lambda n, i, s: [(s.pcie_tx_bytes_per_s, {"direction": "tx"}),
                                                                (s.pcie_rx_bytes_per_s, {"direction": "rx"})],
                   "By/s", "PCIe throughput")
        gpu_metric("tide_gpu_nvlink_throughput", lambda n, i, s: [(s.nvlink_tx_bytes_per_s, {"direction": "tx"}),
                                                                  (s.nvlink_rx_bytes_per_s, {"direction": "rx"})],
                   "By/s", "NVLink throughput")
        gpu_metric("tide_gpu_sm_clock", lambda n, i, s: [(s.sm_clock_hz, {})], "Hz", "SM clock")
        gpu_metric("tide_gpu_sm_efficiency_ratio", self._sm_efficiency, "1",
                   "utilisation x SM clock / max SM clock (0-1)")
        gpu_metric("tide_gpu_power", lambda n, i, s: [(s.power_watts, {})], "W", "GPU power draw")
        gpu_metric("tide_gpu_temperature", lambda n, i, s: [(s.temperature_c, {})], "Cel", "GPU temperature")
        gpu_metric("tide_gpu_ecc_uncorrected_errors", lambda n, i, s: [(s.ecc_uncorrected_errors, {})], "{error}",
                   "uncorrected volatile ECC errors (NVML, since the driver loaded)")
        meter.create_observable_counter(
            "tide_gpu_xid_errors", [self._xid_errors], unit="{error}",
            description="XID errors seen on a GPU since the metrics service started, by XID code")
        gauge("tide_node_gpu_allocation_ratio", [self._node_alloc], unit="1",
              description="allocated share of a node's GPUs by kind (whole, shared, mig, all)")
        gauge("tide_pool_gpu_allocation_ratio", [self._pool_alloc], unit="1",
              description="allocated share of a pool's GPUs by kind")
        gauge("tide_cluster_gpu_allocation_ratio", [self._cluster_alloc], unit="1",
              description="allocated share of the cluster's GPUs by kind")
        gauge("tide_pool_gpus", [lambda o: [Observation(a.gpus, {"pool": p})
                                            for p, a in self.snapshot.pool_alloc.items()]],
              unit="{gpu}", description="GPUs per pool")
        gauge("tide_gpu_fragmentation_ratio", [lambda o: [Observation(f.ratio, {"pool": p})
                                                          for p, f in self.snapshot.frag.items()]],
              unit="1", description="share of free GPU capacity no pending pod can use")
        gauge("tide_gpu_free_gpus", [lambda o: [Observation(f.free_gpus, {"pool": p})
                                                for p, f in self.snapshot.frag.items()]],
              unit="{gpu}", description="free GPU capacity (GPU units)")
        gauge("tide_gpu_fragmented_gpus", [lambda o: [Observation(f.fragmented_gpus, {"pool": p})
                                                      for p, f in self.snapshot.frag.items()]],
              unit="{gpu}", description="free GPU capacity no pending pod can use (GPU units)")
        gauge("tide_queue_pending_jobs", [self._pending], unit="{job}",
              description="pending jobs per queue and priority class")
        gauge("tide_queue_used_gpus", [lambda o: [Observation(v, {"queue": q})
                                                  for q, v in self.snapshot.queue_used.items()]],
              unit="{gpu}", description="GPUs held by a queue's jobs")
        gauge("tide_queue_lent_gpus", [lambda o: [Observation(lb[0], {"queue": q})
                                                  for q, lb in self.snapshot.lent_borrowed.items()]],
              unit="{gpu}", description="unused guaranteed GPUs other queues borrow (tidal)")
        gauge("tide_queue_borrowed_gpus", [lambda o: [Observation(lb[1], {"queue": q})
                                                      for q, lb in self.snapshot.lent_borrowed.items()]],
              unit="{gpu}", description="GPUs a queue uses beyond its guarantee (tidal)")
        gauge("tide_pool_lent_gpus", [lambda o: [Observation(lb[0], {"pool": p})
                                                 for p, lb in self.snapshot.pool_lending.items()]],
              unit="{gpu}", description="GPUs of a pool's nodes held by jobs of other pools (tidal lending)")
        gauge("tide_pool_borrowed_gpus", [lambda o: [Observation(lb[1], {"pool": p})
                                                     for p, lb in self.snapshot.pool_lending.items()]],
              unit="{gpu}", description="GPUs a pool's jobs hold on other pools' nodes (tidal lending)")
        gauge("tide_feedback_memory_multiplier", [lambda o: [
            Observation(w.memory_multiplier, {"family": f}) for f, w in self.snapshot.weights.items()]],
            unit="1", description="the feedback loop's GPU memory multiplier per job family")
        gauge("tide_feedback_affinity", [lambda o: [
            Observation(w.affinity, {"family": f}) for f, w in self.snapshot.weights.items()]],
            unit="1", description="the feedback loop's topology affinity per job family (>= 1: one node)")
        meter.create_observable_counter(
            "tide_process_restarts", [self._process_restarts], unit="1",
            description="restarts of each stack process by the `tide up` supervisor (from its health.json)")

    # ------------------------------------------------------------ observations
    def _process_restarts(self, options: CallbackOptions) -> Iterable[Observation]:
        """Read at each scrape from the health file the supervisor keeps (TIDE_HEALTH_FILE, set by `tide up`;
        a service run any other way, e.g. under systemd, has none and exports no series)."""
        path = os.environ.get("TIDE_HEALTH_FILE")
        if not path:
            return []
        try:
            with open(path) as f:
                document = json.load(f)
        except (OSError, ValueError):
            return []
        return [Observation(int(p.get("restarts", 0)), {"process": str(p["name"])})
                for p in document.get("processes", []) if "name" in p]

    def _event_counts(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"kind": kind, "queue": queue, "priority_class": pc})
                for (kind, queue, pc), n in list(self.event_counts.items())]

    def _xid_errors(self, options: CallbackOptions) -> Iterable[Observation]:
        pools = self.snapshot.pools
        return [Observation(n, {"node": node, "gpu": str(i), "pool": pools.get(node, state.DEFAULT_POOL),
                                "xid": str(xid)})
                for (node, i, xid), n in list(self.xid_counts.items())]

    def _dcgm_views(self) -> list[dcgm.GpuView]:
        now, snap = time.time(), self.snapshot
        return [dcgm.GpuView(node, sample, snap.models.get((node, i), ""), snap.pools.get(node, state.DEFAULT_POOL),
                             snap.holders.get((node, i), ()), self.last_xid.get((node, i), 0))
                for (node, i), (ts, sample) in list(self.gpus.items()) if now - ts <= SAMPLE_STALE_S]

    def _per_gpu(self, fn: Callable[[str, int, GpuSample], Iterable[tuple[float, dict[str, str]]]]):
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            now = time.time()
            for (node_id, index), (ts, sample) in list(self.gpus.items()):
                if now - ts > SAMPLE_STALE_S:
                    continue
                pool = self.snapshot.pools.get(node_id, state.DEFAULT_POOL)
                base = {"node": node_id, "gpu": str(index), "pool": pool}
                for value, extra in fn(node_id, index, sample):
                    yield Observation(value, {**base, **extra})

        return callback

    def _sm_efficiency(self, node_id: str, index: int, s: GpuSample) -> list[tuple[float, dict[str, str]]]:
        model = self.snapshot.models.get((node_id, index), "")
        return [(state.sm_efficiency(s.utilization_ratio, s.sm_clock_hz, model,
                                     self.max_clock.get((node_id, index), 0.0)), {})]

    def _alloc_obs(self, allocs: dict[str, state.Allocated], label: str | None, extra: Callable[[str], dict]):
        for key, a in allocs.items():
            for kind in (*state.KINDS, "all"):
                attrs = {"kind": kind, **extra(key)}
                if label:
                    attrs[label] = key
                yield Observation(a.ratio(kind), attrs)

    def _node_alloc(self, options: CallbackOptions) -> Iterable[Observation]:
        pools = self.snapshot.pools
        yield from self._alloc_obs(self.snapshot.node_alloc, "node",
                                   lambda n: {"pool": pools.get(n, state.DEFAULT_POOL)})

    def _pool_alloc(self, options: CallbackOptions) -> Iterable[Observation]:
        yield from self._alloc_obs(self.snapshot.pool_alloc, "pool", lambda p: {})

    def _cluster_alloc(self, options: CallbackOptions) -> Iterable[Observation]:
        yield from self._alloc_obs({"": self.snapshot.cluster_alloc}, None, lambda p: {})

    def _pending(self, options: CallbackOptions) -> Iterable[Observation]:
        counts = dict.fromkeys(self.known_queues, 0)
        counts.update(self.snapshot.pending)
        for (queue, pc), n in counts.items():
            yield Observation(n, {"queue": queue, "priority_class": pc})

    # ------------------------------------------------------------ run
    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(
            consume(self.js, DURABLE_EVENTS, self._on_event, stop, order_key=event_order_key),
            self.dead_letters.run(self.js, stop),
            every(self.settings.metrics_poll_s, stop, self._poll),
        )

    async def close(self) -> None:
        subscriptions = [getattr(self, name, None) for name in ("_api", "_api_tenants", "_telemetry", "_events")]
        for sub in [s for s in subscriptions if s is not None]:  # as far as start() got
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        if hasattr(self, "_dcgm"):
            REGISTRY.unregister(self._dcgm)
        if hasattr(self, "_telemetry_conn"):
            await self._telemetry_conn.close()
        await close_nats(self.nc)
        await self.redis.aclose()

    # ------------------------------------------------------------ Redis state
    async def job_info(self, job_id: str) -> JobInfo | None:
        """The job's spec and family: cached, or read with the other jobs asked for in the same turn."""
        cached = self.jobs.get(job_id)
        return cached if cached is not None else await self._infos(job_id)

    async def _job_infos_in_order(self, job_ids: list[str]) -> list[JobInfo | None]:
        infos = await self.job_infos(job_ids)
        return [infos.get(j) for j in job_ids]

    async def job_infos(self, job_ids: list[str]) -> dict[str, JobInfo]:
        """Spec and family of each job (None-free: unknown jobs are left out); the ones not cached are read
        in one MGET per 1,000."""
        out = {j: info for j in job_ids if (info := self.jobs.get(j)) is not None}
        missing = [j for j in dict.fromkeys(job_ids) if j not in out]
        for start in range(0, len(missing), 1000):
            chunk = missing[start:start + 1000]
            for job_id, raw in zip(chunk, await self.redis.mget([keys.job(j) for j in chunk]), strict=True):
                if raw:  # kept in the result even if the bounded cache has already let it go again
                    out[job_id] = self._remember(job_id, JobRecord.model_validate_json(raw).spec)
        return out

    async def _inventory(self) -> Inventory:
        """Node descriptions and capacities: read again only after a (re-)registration bumps the nodes
        version, or every ``NODES_RESYNC_S``; between those only the nodes' used slots change."""
        r = self.redis
        version = await r.get(keys.NODES_VERSION)
        inv = self.inventory
        if inv is not None and inv.version == version and time.monotonic() - inv.read_at < NODES_RESYNC_S:
            return inv
        node_ids = sorted(await r.smembers(keys.NODES))
        async with r.pipeline(transaction=False) as pipe:
            for n in node_ids:
                pipe.get(keys.node(n))
                pipe.hgetall(keys.capacity(n))
            out = await pipe.execute()
        nodes: dict[str, NodeDescription] = {}
        capacity: dict[str, dict[str, str]] = {}
        for i, n in enumerate(node_ids):
            raw, cap = out[2 * i: 2 * i + 2]
            if raw:
                nodes[n], capacity[n] = NodeDescription.model_validate_json(raw), cap
        self.inventory = Inventory(version, time.monotonic(), nodes, capacity,
                                   pools={n: state.pool_of(d) for n, d in nodes.items()},
                                   models={(n, g.index): g.model for n, d in nodes.items() for g in d.gpus})
        return self.inventory

    def _remember(self, job_id: str, spec: JobSpec) -> JobInfo:
        if len(self.jobs) >= JOB_CACHE:
            for old in list(self.jobs)[: JOB_CACHE // 10]:
                del self.jobs[old]
        info = self.jobs[job_id] = JobInfo(spec, family_of(spec))
        self._know_queue(spec.metadata.queue, spec.metadata.priority_class.value)
        return info

    async def _redis_guarantees(self) -> dict[str, float]:
        """The queue tree the queue service applies (``tide:queues:config``), when no file is configured."""
        raw = await self.redis.get(keys.QUEUE_CONFIG)
        try:
            return state.load_guarantees(json.loads(raw)) if raw else {}
        except (ValueError, KeyError, TypeError, AttributeError):
            return {}

    async def _poll(self) -> None:
        r = self.redis
        inventory = await self._inventory()
        nodes = inventory.nodes
        claim_keys = sorted(await r.smembers(keys.CLAIMS_INDEX))
        pending_ids = await r.zrange(keys.PENDING, 0, -1)
        if self._usage is None or self._usage[0] is not r:  # the script registered once per client
            self._usage = (r, UsageReader(r))
        usage = await self._usage[1].read(list(nodes), claim_keys)
        free = self._free_gpus(inventory, usage.used)
        claims = [(k, json.loads(a)) for k, a in zip(claim_keys, usage.allocs, strict=True) if a]
        weights = {f: FamilyWeights.model_validate_json(w) for f, w in usage.weights.items()}
        claim_jobs = [keys.parse_claim(key)[0] for key, _ in claims]
        infos = await self.job_infos([*pending_ids, *claim_jobs])
        specs = [infos[job_id].spec for job_id in pending_ids if job_id in infos]
        pools = inventory.pools
        queue_used: dict[str, float] = {}
        held: list[tuple[str, str | None, float]] = []
        holders: list[tuple[state.Holder, dict[str, Any]]] = []
        for job_id, (key, alloc) in zip(claim_jobs, claims, strict=True):
            info = infos.get(job_id)
            node = nodes.get(alloc.get("node_id", ""))
            if info is None or node is None:
                continue
            q = info.spec.metadata.queue
            holders.append((state.Holder(job_id, keys.parse_claim(key)[1], q), alloc))
            units = state.gpu_units(alloc, {g.index: g.model for g in node.gpus})
            queue_used[q] = queue_used.get(q, 0.0) + units
            held.append((pools[alloc["node_id"]], info.spec.spec.template.node_selector.get("pool"), units))
        for (q, _pc) in self.known_queues:
            queue_used.setdefault(q, 0.0)
        per_node = state.allocation_by_node(nodes, [a for _, a in claims])
        demand = [d for s in specs if (d := state.demand_of(s)) is not None]
        self.snapshot = Snapshot(
            pools=pools,
            models=inventory.models,
            node_alloc=per_node,
            pool_alloc=state.rollup(per_node, pools),
            cluster_alloc=state.rollup(per_node, dict.fromkeys(per_node, "")).get("", state.Allocated()),
            frag=state.fragmentation(nodes, free, demand),
            pending=state.pending_counts(specs),
            queue_used=queue_used,
            lent_borrowed=state.lent_borrowed(queue_used, self.guarantees or await self._redis_guarantees()),
            pool_lending=state.pool_lending(held + [(p, None, 0.0) for p in set(pools.values())]),
            weights=weights,
            holders=state.gpu_holders(holders),
        )

    def _free_gpus(self, inventory: Inventory, used: list[dict[str, str]]) -> dict[str, list[state.FreeGpu]]:
        """Each node's free GPUs (``used``: the nodes' used hashes, in the inventory's order), computed again only
        for a node whose used hash or inventory changed since the last poll."""
        memo: dict[str, tuple[Inventory, dict[str, str], list[state.FreeGpu]]] = {}
        for (node_id, node), hash_ in zip(inventory.nodes.items(), used, strict=True):
            known = self._free.get(node_id)
            if known is not None and known[0] is inventory and known[1] == hash_:
                memo[node_id] = known
            else:
                memo[node_id] = (inventory, hash_, state.free_gpus(node, inventory.capacity[node_id], hash_))
        self._free = memo
        return {node_id: free for node_id, (_, _, free) in memo.items()}

    # ------------------------------------------------------------ events
    def _know_queue(self, queue: str, pc: str) -> None:
        """Counters start at 0 for every queue and priority class seen, so rates and panels have a series."""
        if (queue, pc) in self.known_queues:
            return
        self.known_queues.add((queue, pc))
        attrs = {"queue": queue, "priority_class": pc}
        self.preemptions.add(0, attrs)
        self.ooms.add(0, attrs)

    async def _on_event(self, msg: Msg) -> None:
        try:
            event = JobEvent.model_validate_json(msg.data)
        except ValueError:
            await msg.term()
            return
        await self.handle_event(event)
        await msg.ack()

    async def _on_digest(self, msg: Msg) -> None:
        """A digest of events (``subjects.DIGEST_EVENT_KINDS``; the others come through ``DURABLE_EVENTS``), in
        the order its service published them."""
        try:
            digest = JobEventDigest.model_validate_json(msg.data)
        except ValueError:
            log.warning("event_digest_invalid", bytes=len(msg.data))
            return
        for event in digest.events:
            if event.kind in subjects.DIGEST_EVENT_KINDS:  # never one of the durable kinds twice
                self._follow(event)

    def _follow(self, event: JobEvent) -> None:
        """A progress event, handled after the job's previous events (its timeline), concurrently with other
        jobs'. What needs no I/O (most events: counting and timing) is handled at once, without a task, unless
        an earlier event of the job is still being handled."""
        previous = self._event_tails.get(event.job_id)
        if previous is None:
            try:
                rest = self._count(event)
            except Exception as exc:  # noqa: BLE001 - a counter missed; the next event goes on
                log.warning("event_not_handled", job_id=event.job_id, kind=event.kind, error=repr(exc))
                return
            if rest is None:
                return
        else:
            rest = None

        async def handle() -> None:
            try:
                if rest is not None:
                    await rest
                else:
                    await asyncio.wait([previous])
                    await self.handle_event(event)
            except Exception as exc:  # noqa: BLE001 - a counter missed; the next event goes on
                log.warning("event_not_handled", job_id=event.job_id, kind=event.kind, error=repr(exc))
            finally:
                if self._event_tails.get(event.job_id) is task:
                    del self._event_tails[event.job_id]

        task = asyncio.get_running_loop().create_task(handle())
        self._event_tails[event.job_id] = task

    async def handle_event(self, event: JobEvent) -> None:
        rest = self._count(event)
        if rest is not None:
            await rest

    def _count(self, event: JobEvent) -> Coroutine[Any, Any, None] | None:
        """Count and time ``event`` (no I/O); the rest of its handling, which reads or writes, or None when
        there is none: the end of the job (``_job_ended``), or the gang wait of a 'placed' event that does not
        carry its gang size (a publisher older than ``JobEvent.gang``)."""
        queue, pc = event.queue or "", event.priority_class or ""
        attrs = {"queue": queue, "priority_class": pc}
        if queue:
            self._know_queue(queue, pc)
        key = (event.kind, queue, pc)
        self.event_counts[key] = self.event_counts.get(key, 0) + 1
        timeline = self.timelines.setdefault(event.job_id, Timeline(event.job_id, queue, pc))
        placed_before = timeline.last.get("placed")
        timeline.add(event.kind, event.ts, event.reason)
        if event.kind == "placed" and event.wait_s is not None:
            self.queue_wait.record(event.wait_s, attrs)
            if event.gang is None:
                return self._gang_wait_read(event.job_id, event.wait_s, attrs)
            if event.gang > 1:
                self.gang_wait.record(event.wait_s, attrs)
        elif event.kind == "running" and placed_before is not None:
            self.placement_latency.record(max(0.0, event.ts - placed_before), attrs)
        elif event.kind == "preempted":
            self.preemptions.add(1, attrs)
        elif (event.kind == "pod-exited" and event.reason == "OOM") or (
                event.kind == "failed" and event.pod is not None and OOM_REASON.search(event.reason)):
            self.ooms.add(1, attrs)  # a one-pod job's terminal event carries its pod's exit (no pod-exited)
        if event.kind in TERMINAL_KINDS:
            return self._job_ended(event, timeline)
        return None

    async def _gang_wait_read(self, job_id: str, wait_s: float, attrs: dict[str, str]) -> None:
        info = await self.job_info(job_id)
        if info is not None and info.gang > 1:
            self.gang_wait.record(wait_s, attrs)

    async def _job_ended(self, event: JobEvent, timeline: Timeline) -> None:
        """The feedback loop's part of a job's end, and its trace. The job's family comes with the event; its
        spec is read (``job_info``) only where the feedback needs it: a job with usage samples (its traffic) or
        an event without a family (a publisher older than ``JobEvent.family``)."""
        usage = self.usage.get(event.job_id)
        info = await self.job_info(event.job_id) if event.family is None or usage is not None else None
        family = event.family if event.family is not None else (info.family if info else None)
        if self.settings.feedback_enabled:
            if event.kind == "failed" and "OOM" in event.reason:
                await self.feedback.job_failed_oom(event.job_id, usage)
            elif event.kind == "succeeded" and (family is None or family in self.snapshot.weights):
                # a clean run only decays a family that has weights: the snapshot (read every poll, and at once
                # after this service, their only writer, changes them) says which, without a read per job
                await self.feedback.job_succeeded(event.job_id, usage, info.spec if info else None)
            if event.kind in ("succeeded", "failed") and usage is not None:
                await self.feedback.job_traffic(event.job_id, usage, info.spec if info else None)
        if spans_wanted():  # the job's trace: only where spans are exported (4 spans a job, ~10 us, otherwise)
            emit(self.tracer, timeline, event.kind, event.ts, {"family": family or "", "reason": event.reason})
        self.timelines.pop(event.job_id, None)
        self.usage.pop(event.job_id, None)
        if self.weights_changed:  # the poll reads them anyway; this only makes a change visible at once
            self.weights_changed = False
            self.snapshot.weights = await self.feedback.weights()

    async def _on_api_weights(self, msg: Msg) -> None:
        """Every family and the whole history on ``tide.api.weights`` (the admin's); on a tenant's own subject
        (``tide.api.weights.<tenant>``: the servers let only that tenant publish there) only what
        ``feedback.tenant_weights`` lets it see."""
        tenant = subjects.tenant_of(msg.subject)
        try:
            family, limit = weights_request(msg.data)
            if tenant is None:
                body = await self.feedback.api_weights(family, limit)
            else:
                body = await self.feedback.api_weights_for(tenant, family, limit)
        except Exception as exc:
            body = {"families": [], "history": [], "error": repr(exc)}
        if msg.reply:
            await msg.respond(json.dumps(body).encode())

    # ------------------------------------------------------------ telemetry
    async def _on_telemetry(self, msg: Msg) -> None:
        try:
            t = Telemetry.model_validate_json(msg.data)
        except ValueError:
            log.warning("bad_telemetry", subject=msg.subject)
            return
        self.handle_telemetry(t)

    def handle_telemetry(self, t: Telemetry) -> None:
        for sample in t.gpus:
            key = (t.node_id, sample.index)
            self.gpus[key] = (t.ts, sample)
            self.max_clock[key] = max(self.max_clock.get(key, 0.0), sample.sm_clock_hz)
            for xid in sample.xid_errors:
                self.last_xid[key] = xid
                self.xid_counts[(*key, xid)] = self.xid_counts.get((*key, xid), 0) + 1
        for usage in t.pods:
            self.usage.setdefault(usage.job_id, JobUsage()).add(t.node_id, usage, t.ts)
        if len(self.usage) > JOB_CACHE:  # jobs whose end we never saw
            cutoff = time.time() - 3600
            for job_id in [j for j, u in self.usage.items() if u.last_ts < cutoff]:
                del self.usage[job_id]


OOM_REASON = re.compile(r"\bOOM\b")
DURABLE_EVENTS = dataclasses.replace(
    subjects.METRICS_EVENTS, filter_subjects=[subjects.job_event("*", kind) for kind in subjects.DURABLE_EVENT_KINDS])
"""The durable consumer ``metrics-events``, on the kinds metrics must not miss only (failures, cancellations,
rejections: ``subjects.DURABLE_EVENT_KINDS``)."""


def event_order_key(msg: Msg) -> str:
    """One job's events are handled in order (its timeline), different jobs' concurrently.

    Subjects are ``tide.events.job.<job id>.<kind>``: the key is the subject without the kind."""
    return msg.subject.rsplit(".", 1)[0]
