"""The placer service: cluster state, placement, gang reservation and commit, binding pods to agents.

A cycle (on a kick, a pod exit, a registration, or every tick) does, in order:
1. reconcile: release lapsed gang reservations and roll their jobs back; declare silent nodes lost;
2. stop the pods of jobs being cancelled or failed;
3. gather a snapshot and let the core plan the cycle (``tide.core.cycle.plan_cycle``: tides, queue
   order, limits, placement, preemption victims, the backfill rule), then carry out the plan: preempt
   victims gracefully (checkpoint notice, SIGTERM, grace, SIGKILL; they are requeued, not failed),
   record why the others wait, and bind each placed gang whole: reserve it in Redis with a TTL, start
   its pods, and commit once every agent acknowledged the start.

The cycle's starts go out together: one ``StartPods`` request per node carrying every pod the cycle
placed there (each start keeps its own fencing token and expiry), and each gang commits or rolls back on
its own answers. An agent reports its pods' transitions in one ``PodStatusBatch`` per heartbeat; a start
it answered ``started`` is recorded with the commit, so a job turns running without waiting for that.
A one-pod job publishes no ``pod-started``/``pod-exited`` event: its ``running`` and terminal events
carry the pod, node and exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import nats
import redis.exceptions
import structlog
from nats.aio.msg import Msg
from opentelemetry import trace
from tide import subjects
from tide.batch import Batcher
from tide.bus.nats import close_nats, connect, consume, ensure_streams
from tide.bus.paced import PacedConnection
from tide.clock import wall_clock
from tide.core import DEFAULT_POLICY, Allocation, Placer, Unfit
from tide.core.cycle import Bind, CycleState, Running, TimedOut, plan_cycle
from tide.core.job_placement import (
    PodPlacement,
    claim_items,
    missing_extras,
    pod_name,
)
from tide.core.lifecycle import (
    PLACEABLE,
    accepts_exit,
    accepts_start,
    adoptable,
    can_roll_back,
    commit,
    extras_attempt,
    finish_cancel,
    gang_timed_out,
    live_floor,
    mark_unplaced,
    nominate,
    pod_exited,
    pod_is_current,
    pod_started,
    pod_token,
    preempt,
    preempt_extras,
    requeue_preempted,
    reserve,
    reserve_extras,
    rollback,
    rollback_extras,
    transition_key,
)
from tide.core.queue_order import pending_score
from tide.core.queues import (
    QueueTree,
)
from tide.core.tides import TideRule, parse_tides
from tide.events import EventPublisher
from tide.runtime import concurrently
from tide.schemas.events import (
    NODE_STATUS,
    POD_DONE_STATES,
    TERMINAL_STATES,
    CommandAck,
    ExitReason,
    GpuAssignment,
    JobRecord,
    JobState,
    NodeRegistered,
    PodExited,
    PodFate,
    PodRecord,
    PodStarted,
    PodState,
    PodStatusBatch,
    SettlePod,
    StartPod,
    StartPods,
    StopPod,
    agent_pod_id,
    parse_agent_pod_id,
)
from tide.schemas.feedback import FamilyWeights
from tide.schemas.node import NodeDescription
from tide.settings import Settings
from tide.store import keys
from tide.store.claims import (
    LAPSE_MARGIN_MS,
    RECORD_CHANGED_WHY,
    RESERVATION_LAPSED,
    WRITTEN,
    ClaimItem,
    ClaimStore,
    FencedOut,
    PodClaim,
    RecordWrite,
)
from tide.store.jobs import JobStore
from tide.store.lease import LeaderLease, transition
from tide.store.redis import redis_for
from tide.tracing import detached_job_span, job_span, stored_parent, trace_headers, traceparent_of

from tide_placer.metrics import PlacerMetrics
from tide_placer.pacing import CyclePacing
from tide_placer.reports import ExitReports, listed_at
from tide_placer.view import ClusterView

log = structlog.get_logger()
tracer = trace.get_tracer("tide.placer")
LOST_CHECK_EVERY_S = 1.0
FENCE_SWEEP_S = 5.0
"""every pod every agent reports is checked against its job's current attempt at least this often"""
FENCE_RESEND_S = 5.0
"""a stop for a stale pod is sent again after this long if the agent still reports it"""
SETTLE_ASK_S = 2.0
"""how long one SettlePod waits for its answer; it is asked again until answered or the node is lost"""
REDIS_AWAY = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
"""what a Redis call raises while the server is away (a restart, a Sentinel failover)"""


@dataclass(frozen=True)
class Reserved:
    """A gang whose slots are reserved in Redis and whose record names the attempt."""

    record: JobRecord
    placements: list[PodPlacement]
    assignments: dict[int, list[GpuAssignment]]
    resv: str
    attempt: int
    grow: bool = False  # elastic extras for a job already running on its gang
    touched: tuple[str, ...] = ()  # the claim keys reserved and the used keys of their items (the commit's keys)


class ReservationLapsed(Exception):
    """A gang's reservation lapsed before its commit was written (its slots are released)."""


class ClaimRefused(Exception):
    """Redis refused a gang's claims (the slots are taken: the view was stale); nothing was claimed or written."""


@dataclass(frozen=True)
class CycleReads:
    """What a cycle plans with, read in one round trip (``queue_cycle_reads``): the queue config, the pending
    jobs, the feedback weights, the lost nodes, and what the cluster view diffs against (the nodes' version, the
    claims held)."""

    raw_config: str | None
    pending_ids: list[str]
    raw_weights: dict[str, str]
    lost: set[str]
    nodes_version: str | None
    claim_keys: set[str]


def queue_cycle_reads(pipe: Any) -> None:
    """Queue ``CycleReads``' reads on a pipeline, in its fields' order."""
    pipe.get(keys.QUEUE_CONFIG)
    pipe.zrange(keys.PENDING, 0, 999)
    pipe.hgetall(keys.WEIGHTS)
    pipe.smembers(keys.LOST_NODES)
    pipe.get(keys.NODES_VERSION)
    pipe.smembers(keys.CLAIMS_INDEX)


class PlacerService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.last_seen: dict[str, float] = {}
        self.started_at = time.time()
        self._kick = asyncio.Event()
        self._pacing = CyclePacing(settings.placer_cycle_gap_s, settings.placer_cycle_gap_above_per_s)
        self._cycle_lock = asyncio.Lock()
        self._lost_checked_at = 0.0
        self._starting: set[asyncio.Task[None]] = set()  # reserved gangs being started and committed
        # fencing: what each agent's last heartbeat says it runs ('<job>/<pod>.a<attempt>'), the nodes
        # whose report changed since it was checked, and when a stale pod was last told to stop
        self.reported: dict[str, frozenset[str]] = {}
        self.reported_at: dict[str, float | None] = {}  # when the agent took that list (its clock; None: unsaid)
        self.exit_reports = ExitReports()  # exits the agents reported: not judged by a list taken before them
        self._fence_dirty: set[str] = set()
        self._fence_swept_at = 0.0
        self._fence_sent: dict[str, float] = {}
        # node leases: what each agent registered (lease, fence grace, heartbeat), the lost nodes whose pods
        # were already rescheduled, and whether this placer has been cut off from NATS (then it heard no one)
        self.leases: dict[str, dict[str, float]] = {}
        self._rescheduled: set[str] = set()
        self._deaf = False
        self._extra_stop_sent: dict[str, float] = {}  # '<job>/<pod>' -> when a pod-level stop was last sent
        self._extras_wanted = True  # a running elastic job misses extras: plan even with nothing pending
        self._leading = asyncio.Event()  # set while this placer holds the leader lease
        self._not_leading = asyncio.Event()
        self._not_leading.set()
        self._settle_asked: dict[str, float] = {}  # left reservations whose agents were asked, and when
        self._own_resv: set[str] = set()  # reservations this placer is starting (others': adopt or let lapse)
        # the reservations that may lapse before this cycle's claims go to Redis, as its reconcile step read them
        # (None: not read yet): the claim script releases them first
        self._lapsing: list[str] | None = None
        self._inherited = False  # the reservations left by the previous leader have been given a fresh TTL
        self._config_cache: tuple[str | None, tuple[QueueTree, list[TideRule]]] | None = None
        self._weights_cache: dict[str, tuple[str, FamilyWeights]] = {}
        policy = DEFAULT_POLICY if settings.placer_policy == "default" else settings.placer_policy
        self.placer = Placer(policy=policy)
        self.metrics = PlacerMetrics(lambda: self.last_seen)  # tide_placer_* on TIDE_PLACER_METRICS_PORT

    async def start(self) -> None:
        self.metrics.serve(self.settings.placer_metrics_host, self.settings.placer_metrics_port)
        self.nc = await connect(self.settings, "tide-placer", inbox_prefix="_INBOX_placer")
        self.js = self.nc.jetstream()
        self.events = EventPublisher(self.js, self.nc)
        await ensure_streams(self.js)
        self.redis = redis_for(self.settings)
        # Only the holder of the leader lease plans, binds and handles node status; every script it runs
        # (claims, job records) carries the lease token and is refused once another placer holds the lease.
        self.lease = LeaderLease(self.redis, keys.PLACER_LEADER, "placer", self.settings.placer_lease_ttl_s,
                                 self.settings.placer_lease_renew_s)
        # the record compare-and-sets of one turn (a cycle's reserved gangs, its commits, a batch's exits) go to
        # Redis in one pipeline
        self._cas_batch: Batcher[tuple[list[str], list[Any]], Any] = Batcher(lambda calls: self.jobs.cas_many(calls))

        async def batched_cas(cas_keys: list[str], cas_args: list[Any]) -> Any:
            result = await self._cas_batch((cas_keys, cas_args))
            if isinstance(result, BaseException):
                raise result
            return result

        self.jobs = JobStore(self.redis, fence=lambda: self.lease.token, cas=batched_cas)
        self.claims = ClaimStore(self.redis, fence=lambda: self.lease.token)
        self.view = ClusterView(self.redis, self.claims, self.settings.placer_resync_s)
        # the Redis steps that concurrent gangs and pods reach in the same turn go out as one call each: a
        # cycle's reservations with the records naming them (one claim script for every gang); the records
        # written with the commits of the gangs whose pods started and with the release of the pods that exited
        # (one script); the records the view cannot judge an exit on (one read)
        ttl_ms = int(self.settings.reservation_ttl_s * 1000)
        self._reserve_batch: Batcher[tuple[list[PodClaim], str, RecordWrite], tuple[bool, str]] = Batcher(
            lambda gangs: self.claims.reserve_many([(c, r) for c, r, _ in gangs], ttl_ms, self._lapsing,
                                                   [w for _, _, w in gangs]))
        self._records_batch: Batcher[str, JobRecord | None] = Batcher(lambda ids: self.jobs.get_many(ids))
        self._writes_batch: Batcher[RecordWrite, int] = Batcher(lambda writes: self.claims.write_records(writes))
        await self._load_node_leases()
        await self.nc.subscribe(subjects.PLACER_KICK, cb=self._on_kick)
        # a job's 'queued' event (published once the job is pending in Redis) is its kick: no message of its own
        await self.nc.subscribe(subjects.job_event("*", "queued"), cb=self._on_kick)
        await self.nc.subscribe(subjects.API_NODES, cb=self._api_nodes)
        # heartbeats on a connection of their own, read in batches: a node's liveness can wait 50 ms
        self._telemetry_conn = await PacedConnection.open(self.settings, "tide-placer-telemetry",
                                                          self.settings.telemetry_read_every_s)
        await self._telemetry_conn.subscribe(subjects.HEARTBEAT_ALL, self._on_telemetry)
        await self._telemetry_conn.subscribe(subjects.TELEMETRY_ALL, self._on_telemetry)  # beats with samples
        await self._lease_step()  # a lone placer leads from its first cycle

    async def _load_node_leases(self) -> None:
        for node_id, raw in (await self.redis.hgetall(keys.NODE_LEASES)).items():
            try:
                self.leases[node_id] = {k: float(v) for k, v in json.loads(raw).items()}
            except (ValueError, TypeError, AttributeError):
                log.warning("bad_node_lease", node_id=node_id)

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(self._lease_loop(stop), self._status_loop(stop), self._cycle_loop(stop))

    async def close(self) -> None:
        if self._starting:  # let reserved gangs finish starting (or roll back) before the connections go
            await asyncio.wait(self._starting, timeout=self.settings.start_ack_timeout_s + 2)
        try:
            if await self.lease.release():
                log.info("placer_leader_released", token=self.lease.state.token)
        except Exception as exc:  # noqa: BLE001 - Redis away: the lease lapses after its TTL instead
            log.warning("placer_leader_release_failed", error=repr(exc))
        await self.events.flush()
        if hasattr(self, "_telemetry_conn"):
            await self._telemetry_conn.close()
        await close_nats(self.nc)
        await self.redis.aclose()

    # ------------------------------------------------------------ leader lease
    def leading(self) -> bool:
        return self.lease.leading()

    async def _lease_step(self) -> None:
        """Renew or try to take the lease, then act on a change of leadership."""
        try:
            await self.lease.step()
        except Exception as exc:  # noqa: BLE001 - Redis away: the lease's own deadline decides
            log.warning("placer_lease_error", error=repr(exc), token=self.lease.state.token)
        await self._leadership_changed(self.lease.leading(), "lease lapsed or taken by another placer")

    async def _leadership_changed(self, now: bool, why: str) -> None:
        """Act on what the lease says now against what this placer last acted on (one log line per change)."""
        change = transition(self._leading.is_set(), now)
        if change == "acquired":
            log.info("placer_leader_acquired", token=self.lease.state.token)
            self.view.invalidate()
            self._not_leading.clear()
            self._leading.set()
            self._kick.set()
            try:
                await self._load_node_leases()  # what the previous leader registered meanwhile
            except Exception as exc:  # noqa: BLE001 - Redis away: registrations fill them in again
                log.warning("node_leases_not_loaded", error=repr(exc))
        elif change == "lost":
            log.warning("placer_leader_lost", token=self.lease.state.token, reason=why)
            self._inherited = False  # leading again, it inherits what the leader meanwhile left
            self._leading.clear()
            self._not_leading.set()

    async def _step_down(self, why: str) -> None:
        """A fenced script refused: another placer holds the lease; stop acting at once."""
        self.lease.drop()
        await self._leadership_changed(False, why)

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.settings.placer_lease_renew_s)
            except TimeoutError:
                pass
            if not stop.is_set():
                await self._lease_step()

    async def _status_loop(self, stop: asyncio.Event) -> None:
        """Pull node status (registrations, pod starts and exits) only while leading; a standby leaves them
        in the stream for the leader."""
        while not stop.is_set():
            if not self._leading.is_set():
                await _first(stop.wait(), self._leading.wait())
                continue
            lost = asyncio.Event()
            watcher = asyncio.create_task(_set_when(lost, stop, self._not_leading))
            try:
                await consume(self.js, subjects.PLACER_NODE_STATUS, self._on_node_status, lost,
                              order_key=status_order_key)
            finally:
                watcher.cancel()

    # ------------------------------------------------------------ triggers
    async def _on_kick(self, msg: Msg) -> None:
        self._pacing.arrived(time.monotonic())
        self._kick.set()

    async def _on_telemetry(self, msg: Msg) -> None:
        """A heartbeat, with GPU samples or without: the subject names the node (only that node's user may
        publish on it)."""
        node_id = subjects.heartbeat_node(msg.subject)
        if node_id is not None:
            self.last_seen[node_id] = time.time()
            headers = msg.headers or {}
            header = headers.get(subjects.PODS_HEADER)
            if header is not None:
                pods = frozenset(p for p in header.split(",") if p)
                self.reported_at[node_id] = listed_at(headers.get(subjects.PODS_AT_HEADER))
                if pods != self.reported.get(node_id):
                    self.reported[node_id] = pods
                    self._fence_dirty.add(node_id)

    async def _cycle_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                try:
                    await asyncio.wait_for(self._kick.wait(), timeout=self.settings.placer_tick_s)
                except TimeoutError:
                    pass
                wait_s = self._pacing.wait_s(time.monotonic())
                if wait_s > 0:  # jobs come fast: this cycle takes those that come meanwhile too
                    await asyncio.sleep(wait_s)
                self._kick.clear()
                self._pacing.started(time.monotonic())
                if self.leading():
                    await self.cycle()
            except FencedOut as exc:
                await self._step_down(str(exc))
            except Exception as exc:
                log.exception("cycle_failed", error=repr(exc))
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------ the scheduling cycle
    async def cycle(self) -> None:
        async with self._cycle_lock, self.metrics.timed_cycle():
            stop_ids, reads = await self._reconcile()
            await self._process_stop_requests(stop_ids)
            await self._place_pending(reads if not stop_ids else None)

    async def _reconcile(self) -> tuple[list[str], CycleReads | None]:
        """The reconciler's steps; returns the jobs asked to stop (read in the same round trip as the
        reservations, which tells whether any lapsed: the expire script runs only then), and what the
        placement step reads, read in that round trip too (None when a step here may have changed it)."""
        if not self._inherited:
            await self._inherit_reservations()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.zrange(keys.RESERVATIONS, 0, -1, withscores=True)
            pipe.llen(keys.EXPIRED_RESERVATIONS)
            pipe.smembers(keys.CANCELLING)
            queue_cycle_reads(pipe)
            (seconds, micros), held_raw, expired_noted, stop_ids, *cycle_reads = await pipe.execute()
        reads: CycleReads | None = CycleReads(*cycle_reads)
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        held = {str(r): float(score) for r, score in held_raw}
        if int(expired_noted) or any(score <= now_ms for score in held.values()):
            reads = None
            for resv in await self.claims.expire():
                job_id, attempt = keys.parse_reservation_id(resv)
                record = await self.jobs.get(job_id)
                if record is not None and record.reservation == resv:
                    await self._rollback(job_id, attempt, "gang reservation lapsed before every pod started")
            held = await self.claims.reservations()
        self._lapsing = sorted(r for r, score in held.items() if score <= now_ms + LAPSE_MARGIN_MS)
        if await self._adopt_reservations(held):
            reads = None
        if await self._detect_lost_nodes():
            reads = None
        await self._fence_reported()  # stop requests to agents: nothing the placement step reads
        return sorted(stop_ids), reads

    async def _inherit_reservations(self) -> None:
        """A new leader's first reconcile gives every reservation it did not make a fresh TTL, also one that
        lapsed while no placer led (a leader killed between its gang's starts and the commit: the next one takes
        the lease only after the old lease's TTL, by when the reservation's may be gone too). Its pods may have
        started, even ended: the agents are asked (``_adopt_reservations``) before a lapse can roll it back, so a
        started gang is adopted, never run again."""
        ttl_ms = int(self.settings.reservation_ttl_s * 1000)
        for resv in await self.claims.reservations():
            if resv not in self._own_resv and await self.claims.revive(resv, ttl_ms):
                log.info("reservation_inherited", reservation=resv, job_id=keys.parse_reservation_id(resv)[0])
        self._inherited = True

    async def _adopt_reservations(self, held: dict[str, float] | None = None) -> bool:
        """Reservations this placer is not starting (a previous leader's, killed or deposed between reserve and
        commit): one whose pods all started, as its job's record says or else as their agents answer, is
        committed now; any other lapses after its TTL and is rolled back by ``_reconcile``, like a
        reservation of a crashed placer (its pods that never started are refused by their agents by then).
        Returns whether it looked at any (and so may have changed records and claims)."""
        if held is None:
            held = await self.claims.reservations()
        self._settle_asked = {r: t for r, t in self._settle_asked.items() if r in held}
        looked = False
        for resv in held:
            if resv in self._own_resv:
                continue
            looked = True
            job_id, attempt = keys.parse_reservation_id(resv)
            record = await self.jobs.get(job_id)
            if record is None:
                continue
            settled: list[tuple[PodRecord, CommandAck]] = []
            if not adoptable(record, resv, attempt):
                settled = await self._agents_started(record, resv, attempt)
                if not settled:
                    continue
            if not await self.claims.commit(resv):
                continue  # lapsed meanwhile: the next reconcile rolls it back
            await self._update(job_id, functools.partial(commit, resv=resv))
            log.info("reservation_adopted", job_id=job_id, reservation=resv)
            await self._apply_settled(job_id, attempt, settled)
        return looked

    async def _agents_started(self, record: JobRecord, resv: str, attempt: int
                              ) -> list[tuple[PodRecord, CommandAck]]:
        """Ask the agents (once per ``SETTLE_ASK_S``) whether every pod of a left reservation started: the
        placer that sent the starts may have died before their acknowledgements, and the pod-started reports
        may not be handled yet. Each pod with its agent's answer when every one started (runs or ended), else
        nothing."""
        pods = [p for p in record.pods if p.node and pod_token(record, p) == attempt]
        if (record.reservation != resv or record.cancel_requested or record.state in TERMINAL_STATES or not pods
                or time.monotonic() - self._settle_asked.get(resv, -SETTLE_ASK_S) < SETTLE_ASK_S):
            return []
        self._settle_asked[resv] = time.monotonic()
        answers = await asyncio.gather(*[
            self._request(p.node or "", SettlePod(job_id=record.job_id, pod=agent_pod_id(p.name, attempt)),
                          SETTLE_ASK_S / 2)
            for p in pods])
        fates = [ack.fate if ack else None for ack in answers]
        log.info("reservation_settled", job_id=record.job_id, reservation=resv,
                 fates=[f.value if f else "unanswered" for f in fates])
        if not all(f in (PodFate.RUNNING, PodFate.EXITED) for f in fates):
            return []
        return [(p, ack) for p, ack in zip(pods, answers, strict=True) if ack is not None]

    async def _apply_settled(self, job_id: str, attempt: int, settled: list[tuple[PodRecord, CommandAck]]) -> None:
        """An adopted gang's pods started, and those that ended exited, as their agents answered: the job runs
        (or ends) now rather than when the pods' own reports come (a dead leader may have pulled them: they
        come back only after the consumer's ack wait). The reports change nothing when they come."""
        for pod, ack in settled:
            await self._pod_started(PodStarted(node_id=pod.node or "", job_id=job_id,
                                               pod=agent_pod_id(pod.name, attempt), pid=0))
            if ack.fate == PodFate.EXITED and ack.exited is not None:
                await self._pod_exited(ack.exited)

    async def queue_config(self) -> tuple[QueueTree, list[TideRule]]:
        return self._queue_config(await self.redis.get(keys.QUEUE_CONFIG))

    def _queue_config(self, raw: str | None) -> tuple[QueueTree, list[TideRule]]:
        """The queue tree and tides of the stored config (parsed again only when it changed)."""
        if self._config_cache is None or self._config_cache[0] != raw:
            config = json.loads(raw) if raw else None
            self._config_cache = (raw, (QueueTree.from_config(config), parse_tides(config)))
        return self._config_cache[1]

    async def family_weights(self) -> dict[str, FamilyWeights]:
        """The feedback loop's per-family adjustments (tide:placer:weights), applied to this cycle's decisions."""
        return self._family_weights(await self.redis.hgetall(keys.WEIGHTS))

    def _family_weights(self, raws: dict[str, str]) -> dict[str, FamilyWeights]:
        out = {}
        for family, raw in raws.items():
            cached = self._weights_cache.get(family)
            if cached is not None and cached[0] == raw:
                out[family] = cached[1]
                continue
            try:
                out[family] = FamilyWeights.model_validate_json(raw)
            except ValueError:
                log.warning("bad_family_weights", family=family)
                continue
            self._weights_cache[family] = (raw, out[family])
        for family in [f for f in self._weights_cache if f not in raws]:
            del self._weights_cache[family]
        return out

    async def _place_pending(self, reads: CycleReads | None = None) -> None:
        """Gather the snapshot, let the core plan the cycle, carry out the plan. ``reads``: what the cycle
        plans with as the reconcile step read it (else read here)."""
        if reads is None:
            async with self.redis.pipeline(transaction=False) as pipe:
                queue_cycle_reads(pipe)
                reads = CycleReads(*await pipe.execute())
        tree, tides = self._queue_config(reads.raw_config)
        pending_ids, nodes_version, claim_keys = list(reads.pending_ids), reads.nodes_version, reads.claim_keys
        if not pending_ids and not tides and not self._extras_wanted:
            if self.view.rebuild_due(nodes_version):
                # No job waits on this cycle: the view is rebuilt now rather than in the next job's cycle (1,000
                # nodes: reading and building them, 165 ms the first time; the GC freeze once they held still,
                # ~100 ms; docs/benchmarks.md, issue 17 seventh round).
                await self.view.refresh(pending_ids, (nodes_version, set(claim_keys)))
            return
        now = time.time()
        pending: list[JobRecord] = []
        for job_id, record in zip(pending_ids, await self.view.records(pending_ids), strict=True):
            if record is not None and not placeable(record):  # the view's copy may be out of date
                record = (await self.view.records([job_id], fresh=True))[0]
            if record is None or not placeable(record):
                await self.jobs.dequeue(job_id)
                continue
            pending.append(record)
        nodes, cluster, running = await self.view.refresh(pending_ids, (nodes_version, set(claim_keys)))
        # the running elastic jobs, found once (by the view's tally): only they have extras to place, hold or stop
        elastic = self.view.elastic(running)
        self._extras_wanted = any(r.state == JobState.RUNNING and missing_extras(r) for r, _ in elastic.values())
        if not nodes:
            return
        state = CycleState(
            nodes=nodes,
            cluster=cluster,
            pending=pending,
            running=running,
            tree=tree,
            tides=tides,
            weights=self._family_weights(reads.raw_weights),
            lost=set(reads.lost),
            now=now,
            wall=wall_clock(self.settings.clock_file),
            min_runtime_s=self.settings.min_runtime_s,
            preemption_timeout_s=self.settings.preemption_timeout_s,
            extra_allocs=self.view.extra_allocs(elastic),
            tally=self.view.tally,
        )
        await self._resend_extra_stops(elastic)
        plan = plan_cycle(state, self.placer)
        self.metrics.observe_plan(state, plan)
        if self.settings.decision_log is not None and (plan.binds or plan.grows):
            from tide.sim.replay_log import append_decision

            append_decision(self.settings.decision_log, state, plan, self.placer.policy)
        for timed_out in plan.timed_out:
            await self._timed_out(timed_out)
        for preemption in plan.preemptions:
            if preemption.pods:
                await self._preempt_pods(preemption.job_id, preemption.pods, preemption.by, preemption.why)
            else:
                await self._preempt(preemption.job_id, preemption.by, preemption.why)
        for job_id, reason in plan.nominations.items():
            victims = [p.job_id for p in plan.preemptions if p.by == job_id]
            log.info("preemption", job_id=job_id, victims=victims, reason=reason)
            await self._nominate(job_id, reason)
        for record, unfit in plan.not_placed:
            await self._not_placed(record, unfit)
        gate = asyncio.Semaphore(self.settings.placer_bind_concurrency)

        async def reserve(b: Bind, grow: bool = False) -> None:
            if b.feedback is not None:
                log.info("feedback_applied", job_id=b.record.job_id, family=b.feedback.family,
                         memory_multiplier=b.feedback.memory_multiplier, affinity=b.feedback.affinity)
            with stored_parent(b.record.trace_parent), job_span(tracer, "placer.reserve", b.record.job_id,
                                                                 pods=len(b.placements)):  # the job's trace
                reserved = await self._reserve(b.record, b.placements, self.view.by_id, grow, gate)
            self.metrics.reservation(reserved is not None)
            if reserved is not None:
                gangs.append(reserved)

        # The plan's gangs are independent of each other (each was placed on what the previous left): their
        # claims go to Redis in one script call (each gang all or nothing, in the plan's order), then each
        # records its attempt (at most ``placer_bind_concurrency`` at once). The cycle waits for their
        # reservations (so the next cycle sees them in Redis) but not for the agents' acknowledgements: starting
        # (one request per node for all the cycle's pods there) and committing go on in the background.
        gangs: list[Reserved] = []
        await asyncio.gather(*[reserve(b) for b in plan.binds], *[reserve(g, True) for g in plan.grows])
        if gangs:
            task = asyncio.get_running_loop().create_task(self._start_cycle(gangs))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _update(self, job_id: str, change: Callable[[JobRecord], bool], dequeue: bool = False,
                      write: Callable[[str, str], Awaitable[bool]] | None = None) -> JobRecord | None:
        """Change a job record atomically (``JobStore.change``, starting from the view's copy) and keep the
        result in the view; with ``dequeue`` the job leaves the pending set in the same step. ``write``: the
        compare-and-set with more in the same step (``_exit_write``, ``_commit_write``, ``_reserve``'s)."""
        kept = self.view.kept(job_id)
        result = await self.jobs.change(job_id, change, known=kept.raw if kept else None, dequeue=dequeue,
                                        write=write, known_record=kept.record if kept else None)
        if result is None:
            return None
        record, raw = result
        self.view.remember(record, raw)
        return record

    def _exit_write(self, job_id: str, release: tuple[str, ...]) -> Callable[[str, str], Awaitable[bool]]:
        """A record write that releases the claims ``release`` names in the same step (an exited pod's), with the
        other writes of the turn (``ClaimStore.write_records``)."""

        async def write(expected: str, new: str) -> bool:
            held = [self.view.allocs.get(k) for k in release]
            touches = tuple(keys.used(a.node_id) for a in held if a is not None) if None not in held else None
            return await self._writes_batch(RecordWrite(job_id, expected, new, release, touches=touches)) == WRITTEN

        return write

    def _commit_write(self, job_id: str, committing: Callable[[], str], commit_keys: tuple[str, ...]
                      ) -> Callable[[str, str], Awaitable[bool]]:
        """A record write that commits, in the same step, the reservation ``committing()`` names once the change
        ran ('' when the change did not commit one; ``commit_keys``: its claim keys and their used keys), with the
        other writes of the turn; ``ReservationLapsed`` when it lapsed first (nothing written)."""

        async def write(expected: str, new: str) -> bool:
            resv = committing()
            outcome = await self._writes_batch(
                RecordWrite(job_id, expected, new, commit=resv, touches=commit_keys if resv else ()))
            if outcome == RESERVATION_LAPSED:
                raise ReservationLapsed(resv)
            return outcome == WRITTEN

        return write

    async def _nominate(self, job_id: str, reason: str) -> None:
        await self._update(job_id, lambda r: nominate(r, reason, time.time()))

    async def _not_placed(self, record: JobRecord, unfit: Unfit) -> None:
        state = JobState.PENDING if unfit.resolvable else JobState.UNSCHEDULABLE
        if record.state == state and record.reason == unfit.reason:
            return
        updated = await self._update(record.job_id, lambda r: mark_unplaced(r, state, unfit.reason))
        if updated is not None and state == JobState.UNSCHEDULABLE:
            log.info("job_unschedulable", job_id=record.job_id, reason=unfit.reason)
            await self.events.publish(updated, "unschedulable")

    async def _timed_out(self, timed_out: TimedOut) -> None:
        """A pending gang past its gangTimeoutSeconds: it fails, or its spec shrinks to minMember 1."""
        job_id = timed_out.record.job_id
        updated = await self._update(job_id, lambda r: gang_timed_out(
            r, timed_out.record.spec, timed_out.action, timed_out.spec, timed_out.reason, time.time()),
            dequeue=timed_out.action == "fail")
        if updated is None:
            return
        log.info("gang_timeout", job_id=job_id, action=timed_out.action, reason=timed_out.reason)
        await self.events.publish(updated, "failed" if timed_out.action == "fail" else "shrunk",
                                  reason=timed_out.reason)

    # ------------------------------------------------------------ preemption
    async def _preempt_pods(self, job_id: str, pods: tuple[int, ...], by: str, why: str) -> None:
        """Stop only some elastic extra pods of a running job (pod-level preemption): the job keeps running
        on the rest; each stopped extra wants placement again once its exit is in."""
        chosen: list[tuple[str, str, int]] = []

        def mark(r: JobRecord) -> bool:
            chosen[:] = preempt_extras(r, pods, by, why)
            return bool(chosen)

        updated = await self._update(job_id, mark)
        if updated is None:
            return
        grace = updated.spec.spec.grace_period_s
        for name, node, token in chosen:
            log.info("extra_pod_preempted", job_id=job_id, pod=name, node_id=node, by=by, reason=why)
            await self.events.publish(updated, "pod-preempted", pod=name, node=node,
                                      reason=f"preempted by {by} ({why})")
            await self._stop_extra(job_id, name, node, token, grace, f"preempted by {by}")

    async def _stop_extra(self, job_id: str, pod: str, node: str, token: int, grace: float, reason: str) -> None:
        self._extra_stop_sent[f"{job_id}/{pod}"] = time.monotonic()
        err = await self._send(node, StopPod(job_id=job_id, pod=agent_pod_id(pod, token), grace_s=grace,
                                             reason=reason))
        if err:  # the node is gone: the pod is as good as stopped
            await self._pod_exited(PodExited(node_id=node, job_id=job_id, pod=agent_pod_id(pod, token),
                                             exit_code=None, reason=ExitReason.STOPPED, message=err))

    async def _resend_extra_stops(self, elastic: Running) -> None:
        """Extras marked stopping whose stop was not sent by this placer lately (it restarted, the agent
        missed it) are told again, so a pod-level preemption survives a placer restart. ``elastic``: the running
        elastic jobs (only their pods beyond ``minMember`` are ever marked stopping: ``preempt_pods``)."""
        now = time.monotonic()
        for record, _ in elastic.values():
            for p in record.pods:
                key = f"{record.job_id}/{p.name}"
                if not (p.stopping and p.node and p.state not in POD_DONE_STATES):
                    self._extra_stop_sent.pop(key, None)
                    continue
                if now - self._extra_stop_sent.get(key, -FENCE_RESEND_S) >= FENCE_RESEND_S:
                    await self._stop_extra(record.job_id, p.name, p.node, pod_token(record, p),
                                           record.spec.spec.grace_period_s, p.reason or "preempted")

    async def _preempt(self, job_id: str, by: str, why: str) -> None:
        """Stop a running job gracefully (checkpoint notice, SIGTERM, grace, SIGKILL) and requeue it."""
        updated = await self._update(job_id, lambda r: preempt(r, by, why))
        if updated is None:
            return
        await self.events.publish(updated, "checkpoint", reason="checkpoint now: preemption follows")
        await self.events.publish(updated, "preempted")
        await self.jobs.request_stop(job_id)
        self._kick.set()

    async def _requeue_preempted(self, job_id: str) -> None:
        updated = await self._update(job_id, lambda r: requeue_preempted(r, time.time()))
        if updated is not None:
            await self.jobs.stop_done(job_id)
            await self.jobs.requeue(job_id, pending_score_of(updated))
            await self.events.publish(updated, "requeued")
            self._kick.set()

    # ------------------------------------------------------------ reserve -> start -> commit
    async def _reserve(self, record: JobRecord, placements: list[PodPlacement],
                       by_id: dict[str, NodeDescription], grow: bool = False,
                       gate: asyncio.Semaphore | None = None) -> Reserved | None:
        """Reserve every pod's slots in one atomic step (with a TTL) and record the attempt.

        ``grow``: the pods are elastic extras of a job running on its gang; the attempt (a new fencing token
        for them alone) leaves its running pods as they are.

        Returns None when Redis refused (the cluster view was stale: it is invalidated) or the job changed
        meanwhile (cancelled, or another placer got there first; the slots are handed back)."""
        job_id = record.job_id
        attempt = record.attempts + 1
        resv = keys.reservation_id(job_id, attempt)
        assignments = {p.pod_index: gpu_assignments(by_id[p.alloc.node_id], p.alloc) for p in placements}
        claims = [
            PodClaim(
                job_id=job_id,
                pod=pod_name(job_id, p.pod_index),
                items=tuple(ClaimItem(n, f, a) for n, f, a in claim_items(
                    p.alloc, {g.index: g.model for g in by_id[p.alloc.node_id].gpus})),
                alloc=p.alloc.to_dict(),
            )
            for p in placements
        ]
        pods = {p.pod_index: (p.alloc.node_id, [g.uuid for g in assignments[p.pod_index]]) for p in placements}

        def assign(r: JobRecord) -> bool:
            return reserve_extras(r, attempt, resv, pods) if grow else reserve(r, attempt, resv, pods, record.spec)

        async def reserve_and_write(expected: str, new: str) -> bool:
            """The claims and the record naming the attempt in one step, with the other gangs of the cycle (one
            script call); a record that changed meanwhile claims nothing (the change is made again on it)."""
            ok, why = await self._reserve_batch((claims, resv, RecordWrite(job_id, expected, new, dequeue=not grow)))
            if not ok and why != RECORD_CHANGED_WHY:
                raise ClaimRefused(why)
            return ok

        self._own_resv.add(resv)
        try:
            async with gate or contextlib.nullcontext():
                updated = await self._update(job_id, assign, write=reserve_and_write)
        except ClaimRefused as refused:
            self._own_resv.discard(resv)
            log.info("reserve_lost", job_id=job_id, reason=str(refused))
            self.view.invalidate()  # Redis refused what the view thought was free
            return None
        if updated is None:  # cancelled, or another placer got there first (not a stale view): nothing claimed
            self._own_resv.discard(resv)
            return None
        # applied without a read; each claim was built from its placement, whose allocation it holds
        self.view.note_claims({c.key: p.alloc for c, p in zip(claims, placements, strict=True)})
        log.info("job_reserved", job_id=job_id, reservation=resv, nodes=sorted({p.alloc.node_id for p in placements}),
                 pods=[p.pod_index for p in placements], extras=grow)
        touched = tuple([c.key for c in claims] + sorted({keys.used(i.node_id) for c in claims for i in c.items}))
        return Reserved(updated, placements, assignments, resv, attempt, grow, touched)

    async def _start_cycle(self, gangs: list[Reserved]) -> None:
        """Start the gangs one cycle reserved: their placed events, then one request per node carrying every
        start of the cycle for it (``StartPods``; a lone start goes as a ``StartPod``); each gang then commits
        or rolls back on its own answers (``_start``), as if it had sent its starts alone.

        Each gang's ``placer.start`` span (in the job's trace: ``JobRecord.trace_parent``) runs from its starts
        going out to its commit or rollback; each start carries it (``StartPod.traceparent``), so the agents'
        spans for the job join its trace even inside a batch of other jobs' starts."""
        answers: dict[str, dict[int, CommandAck | BaseException | None]] = {g.resv: {} for g in gangs}
        spans = {g.resv: detached_job_span(tracer, "placer.start", g.record.job_id, g.record.trace_parent,
                                           pods=len(g.placements)) for g in gangs}
        try:
            commands = {g.resv: self._start_commands(g, traceparent_of(spans[g.resv])) for g in gangs}
            placed = [_in_span(spans[g.resv], self._placed_event(g)) for g in gangs]  # its headers: the job's trace
            if self.settings.fault_pause_after_reserve_s:
                await asyncio.gather(*placed, return_exceptions=True)
                placed = []
                await asyncio.sleep(self.settings.fault_pause_after_reserve_s)
            by_node: dict[str, list[tuple[str, int, StartPod]]] = {}
            for g in gangs:
                for p in g.placements:
                    by_node.setdefault(p.alloc.node_id, []).append((g.resv, p.pod_index, commands[g.resv][p.pod_index]))
            # the placed events are queued on the connection before the start commands: they stay first
            results = await asyncio.gather(
                *placed, *[self._request_starts(node, [c for _, _, c in items]) for node, items in by_node.items()],
                return_exceptions=True)
            for g, event in zip(gangs if placed else [], results[:len(placed)], strict=True):
                if isinstance(event, BaseException):  # the starts went out: losing their event must not undo them
                    log.warning("placed_event_lost", job_id=g.record.job_id, error=repr(event))
            for (_, items), result in zip(by_node.items(), results[len(placed):], strict=True):
                for i, (resv, index, _) in enumerate(items):
                    answers[resv][index] = result if isinstance(result, BaseException) else result[i]
        except Exception as exc:  # noqa: BLE001 - each gang undoes its attempt through its own path below
            for g in gangs:
                answers[g.resv] = {p.pod_index: exc for p in g.placements}

        async def finish(g: Reserved) -> None:
            with trace.use_span(spans[g.resv], end_on_exit=True):
                await self._start_or_roll_back(g, answers[g.resv])

        await asyncio.gather(*[finish(g) for g in gangs])

    async def _request_starts(self, node_id: str, starts: list[StartPod]) -> list[CommandAck | None]:
        """One node's starts of a cycle in one request; the answers in the same order (None: unanswered)."""
        with stored_parent(starts[0].traceparent):  # the header: the first start's trace (each start has its own)
            if len(starts) == 1:
                return [await self._request(node_id, starts[0])]
            ack = await self._request(node_id, StartPods(starts=starts))
        if ack is None:
            return [None] * len(starts)
        if len(ack.acks) == len(starts):
            return list(ack.acks)
        if not ack.ok:  # refused whole (before any start was handled: a malformed request, a fenced agent)
            return [CommandAck(ok=False, error=ack.error or "refused")] * len(starts)
        log.warning("start_batch_answer_malformed", node_id=node_id, starts=len(starts), acks=len(ack.acks))
        return [None] * len(starts)  # what the agent did is unknown: each start is settled (SettlePod)

    def _placed_event(self, reserved: Reserved) -> Coroutine[Any, Any, None]:
        updated = reserved.record
        if reserved.grow:
            return self.events.publish(updated, "extras-placed",
                                       reason=f"elastic extra pods {[p.pod_index for p in reserved.placements]}")
        return self.events.publish(updated, "placed", wait_s=time.time() - updated.submitted_at,
                                   reason="placed")

    def _start_commands(self, reserved: Reserved, traceparent: str | None = None) -> dict[int, StartPod]:
        """The ``StartPod`` of each pod of a reserved gang, by pod index (each carrying ``traceparent``)."""
        updated, resv, attempt = reserved.record, reserved.resv, reserved.attempt
        by_index = {p.index: p for p in updated.pods}
        floor = live_floor(updated)
        world = sum(1 for p in updated.pods if p.node and p.state not in POD_DONE_STATES)
        tmpl = updated.spec.spec.template
        share = tmpl.resources.gpu_share
        return {
            p.pod_index: StartPod(
                event_id=f"{resv}.{p.pod_index}.start",
                job_id=updated.job_id,
                pod=agent_pod_id(by_index[p.pod_index].name, attempt),
                pod_index=p.pod_index,
                world_size=world,
                command=tmpl.command,
                image=tmpl.image,
                env={**tmpl.env, "TIDE_PREEMPTIONS": str(updated.preemptions),
                     "TIDE_LAST_CHECKPOINT_AT": str(updated.last_checkpoint_at or "")},
                gpus=reserved.assignments[p.pod_index],
                share_sm_percent=share.sm_percent if share else None,
                share_memory_mib=p.alloc.gpu_mem_mib[0] if share and p.alloc.gpu_mem_mib else None,
                cpu_milli=p.alloc.cpu_milli,
                memory_mib=p.alloc.memory_mib,
                job_floor=floor,
                traceparent=traceparent,
            )
            for p in reserved.placements
        }

    async def _start_or_roll_back(self, reserved: Reserved,
                                  answers: dict[int, CommandAck | BaseException | None]) -> None:
        """A background start that fails outright (Redis or NATS away) undoes its attempt, logged. A fenced
        one (another placer leads now) leaves the attempt to the leader: adopted or lapsed."""
        try:
            await self._start(reserved, answers)
        except FencedOut as exc:
            await self._step_down(str(exc))
        except Exception as exc:
            job_id = reserved.record.job_id
            log.exception("start_failed", job_id=job_id, reservation=reserved.resv, error=repr(exc))
            try:
                await self._rollback(job_id, reserved.attempt, f"start failed: {exc!r}")
            except FencedOut as fenced:
                await self._step_down(str(fenced))
            except Exception:  # still away: the reservation lapses and the lapse sweep requeues the job
                log.exception("rollback_failed", job_id=job_id, reservation=reserved.resv)
        finally:
            self._own_resv.discard(reserved.resv)

    async def _start(self, reserved: Reserved, answers: dict[int, CommandAck | BaseException | None]) -> None:
        """Act on the agents' answers to a reserved gang's starts: commit once every agent acknowledged (the
        pods it answered started are recorded running in the same step), else roll the gang back whole."""
        updated, placements, resv, attempt = reserved.record, reserved.placements, reserved.resv, reserved.attempt
        job_id = updated.job_id
        with job_span(tracer, "placer.commit", job_id, pods=len(placements)):  # in placer.start
            for p in placements:
                answer = answers.get(p.pod_index)
                if isinstance(answer, BaseException):
                    raise answer
            results = [a if isinstance(a, CommandAck) else None for a in (answers.get(p.pod_index) for p in placements)]
            errors = {p.pod_index: start_error(ack) for p, ack in zip(placements, results, strict=True)}
            unanswered = [p for p, ack in zip(placements, results, strict=True) if ack is None]
            refused = {p.pod_index for p, ack in zip(placements, results, strict=True) if ack and not ack.ok}
            absent: set[int] = set()
            if unanswered and not refused:
                # no agent refused: ask what became of the unanswered starts before undoing anything, since
                # a pod whose reply was lost may be running (or done) and must not run again
                fates = await self._settle_starts(updated, resv, attempt, unanswered)
                absent = {i for i, fate in fates.items() if fate == PodFate.ABSENT}
                errors.update({i: "" if fate in (PodFate.RUNNING, PodFate.EXITED) else
                               f"start unanswered, then {fate.value if fate else 'the node was lost'}"
                               for i, fate in fates.items()})
            failed = [p for p in placements if errors[p.pod_index]]
            if failed:
                text = "; ".join(f"{p.alloc.node_id}: {errors[p.pod_index]}" for p in failed)
                # a node that answered 'absent' is healthy (it only missed the start): it is not avoided
                bad = sorted({p.alloc.node_id for p in failed if p.pod_index not in absent})
                await self._rollback(job_id, attempt, f"start failed on {text}", bad_nodes=bad)
                return
            by_index = {p.index: p for p in updated.pods}
            started = [(by_index[p.pod_index].name, p.alloc.node_id)
                       for p, ack in zip(placements, results, strict=True) if ack is not None and ack.started]
            turned: list[str] = []
            committing = [""]  # the reservation the last run of the change committed ('' when it did not)

            def commit_and_start(r: JobRecord) -> bool:
                """The commit, and the pods their agents answered started (their PodStarted follows in the
                agents' next status batch, and changes nothing then)."""
                turned.clear()
                changed = commit(r, resv)
                committing[0] = resv if changed else ""
                for name, node in started:
                    outcome = pod_started(r, name, attempt, node, time.time())
                    changed = changed or outcome is not None
                    if outcome:
                        turned.append(name)
                return changed

            try:
                # the reservation committed in the record's own write: its slots are permanent exactly when the
                # record says the gang started (a record that no longer names it, committed or undone already
                # by whoever changed it, commits nothing)
                record = await self._while_redis_away(
                    lambda: self._update(job_id, commit_and_start,
                                         write=self._commit_write(job_id, lambda: committing[0], reserved.touched)),
                    "commit")
            except ReservationLapsed:
                await self._rollback(job_id, attempt, "gang reservation lapsed before every pod started")
                return
            log.info("gang_committed", job_id=job_id, reservation=resv, pods=len(placements), extras=reserved.grow)
            if record is not None and started:
                await self._started_events(record, started, bool(turned))

    async def _started_events(self, record: JobRecord, started: list[tuple[str, str]], turned: bool) -> None:
        """``pod-started`` for each pod of a gang (a one-pod job's ``running`` carries its pod and node instead),
        then ``running`` when the job turned running."""
        one_pod = len(record.pods) == 1
        if not one_pod:
            for name, node in started:
                await self.events.publish(record, "pod-started", pod=name, node=node, state=record.state,
                                          reason="")
        if turned:
            log.info("job_running", job_id=record.job_id)
            pod, node = started[-1] if one_pod else (None, None)
            await self.events.publish(record, "running", pod=pod, node=node)

    async def _settle_starts(self, record: JobRecord, resv: str, attempt: int, pods: list[PodPlacement]
                             ) -> dict[int, PodFate | None]:
        """Ask each agent what became of the pods whose start it did not answer, until it answers (running,
        exited, absent: ``SettlePod``) or its node is lost past its lease (None: it has fenced itself). The
        reservation is kept alive meanwhile, so no lapse sweep undoes the attempt under the question."""
        by_index = {p.index: p for p in record.pods}
        fates: dict[int, PodFate | None] = {}
        ttl_ms = int(self.settings.reservation_ttl_s * 1000)
        waiting = list(pods)
        while waiting:
            try:
                await self.claims.extend(resv, ttl_ms)
            except REDIS_AWAY as exc:  # a failover: the reservation's TTL covers it, asked again next round
                log.warning("reservation_extend_failed", job_id=record.job_id, reservation=resv, error=repr(exc))
            asked = time.monotonic()
            answers = await asyncio.gather(*[
                self._request(p.alloc.node_id, SettlePod(
                    job_id=record.job_id, pod=agent_pod_id(by_index[p.pod_index].name, attempt)), SETTLE_ASK_S)
                for p in waiting])
            for p, ack in zip(waiting, answers, strict=True):
                if ack is not None and ack.fate is not None:
                    fates[p.pod_index] = ack.fate
                elif await self._fenced_by_lease(p.alloc.node_id):
                    fates[p.pod_index] = None
            waiting = [p for p in waiting if p.pod_index not in fates]
            log.info("start_settled" if not waiting else "start_settling", job_id=record.job_id, attempt=attempt,
                     fates={str(i): (f.value if f else "lost") for i, f in fates.items()}, waiting=len(waiting))
            if waiting:
                await asyncio.sleep(max(0.0, SETTLE_ASK_S / 2 - (time.monotonic() - asked)))
        return fates

    async def _fenced_by_lease(self, node_id: str) -> bool:
        """The node is lost and silent past its lease and fence grace: its agent has stopped its pods."""
        silent = time.time() - self.last_seen.get(node_id, time.time())
        return silent >= self.reschedule_after(node_id) and bool(
            await self.redis.sismember(keys.LOST_NODES, node_id))

    async def _while_redis_away(self, call: Callable[[], Coroutine[Any, Any, Any]], what: str) -> Any:
        """Run a Redis step of a started attempt again while Redis is away (a restart, a failover), for up to
        the reservation TTL: undoing an attempt whose pods run because one write failed would run them twice."""
        deadline = time.monotonic() + self.settings.reservation_ttl_s
        while True:
            try:
                return await call()
            except REDIS_AWAY as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("redis_away_retrying", step=what, error=repr(exc))
                await asyncio.sleep(0.5)

    async def _send(self, node_id: str, command: StartPod | StopPod) -> str:
        """Send a command to a node agent; returns '' on acknowledgement, else the error."""
        return start_error(await self._request(node_id, command))

    async def _request(self, node_id: str, command: StartPod | StartPods | StopPod | SettlePod,
                       timeout_s: float | None = None) -> CommandAck | None:
        """Send a command to a node agent and return its answer; None when none came (the agent, the reply
        or the connection was lost: whether the agent acted on it is unknown).

        A start carries its deadline: an agent that gets it after the placer stopped waiting (a stalled
        agent, a slow network) refuses it, since the attempt is being rolled back or settled."""
        self._must_lead(command)
        timeout = timeout_s or self.settings.start_ack_timeout_s
        if isinstance(command, StartPod):
            command = command.model_copy(update={"expires_at": time.time() + timeout})
        elif isinstance(command, StartPods):  # every start of the batch carries the deadline
            expires = time.time() + timeout
            command = StartPods(event_id=command.event_id, starts=[
                s.model_copy(update={"expires_at": expires}) for s in command.starts])
        try:
            reply = await self.nc.request(subjects.node_cmd(node_id), command.to_bytes(), timeout=timeout,
                                          headers=trace_headers())  # the agent's span joins this trace
        except nats.errors.NoRespondersError:
            if isinstance(command, (StartPod, StartPods)):  # nobody listens there: no start was received
                return CommandAck(ok=False, error="no acknowledgement (no responders: the agent is not listening)")
            log.warning("command_unanswered", job_id=command.job_id, node_id=node_id, command=command.kind,
                        error="NoRespondersError")
            return None
        except nats.errors.Error as exc:  # timeout, a connection lost or reconnecting
            log.warning("command_unanswered", job_id=command.job_id, node_id=node_id, command=command.kind,
                        error=type(exc).__name__)
            return None
        return CommandAck.model_validate_json(reply.data)

    def _must_lead(self, command: StartPod | StartPods | StopPod | SettlePod) -> None:
        """Only the leader commands agents: a placer that lost its lease (it was paused, cut off) sends nothing."""
        if not self.leading():
            raise NotLeading(f"not leading: {type(command).__name__} for job {command.job_id} not sent")

    async def _tell(self, node_id: str, command: StopPod) -> None:
        """Send a command without waiting for an answer (to an agent that may be stalled or gone)."""
        self._must_lead(command)
        try:
            await self.nc.publish(subjects.node_cmd(node_id), command.to_bytes(), headers=trace_headers())
        except Exception as exc:  # noqa: BLE001 - best effort: the heartbeat fencing catches what this misses
            log.warning("command_not_sent", job_id=command.job_id, node_id=node_id, error=repr(exc))

    async def _rollback(self, job_id: str, attempt: int, why: str, bad_nodes: list[str] | None = None) -> None:
        """Undo an attempt whole: stop its live pods, release every claim, requeue with backoff."""
        record = await self.jobs.get(job_id)
        if record is None or not can_roll_back(record, attempt):
            return
        if extras_attempt(record, attempt):
            await self._rollback_extras(record, attempt, why, bad_nodes or [])
            return
        log.warning("job_rollback", job_id=job_id, attempt=attempt, reason=why, bad_nodes=bad_nodes or [])
        skip = set(bad_nodes or [])
        live = [pod for pod in record.pods if pod.node and pod.state not in POD_DONE_STATES]
        await self._stop_now(record, live, skip)
        await self.claims.release([keys.claim(job_id, p.name) for p in record.pods], record.reservation or "")
        backoff = self.settings.requeue_backoff_s * 2 ** min(attempt - 1, 6)
        updated = await self._update(job_id, lambda r: rollback(r, attempt, why, skip, backoff, time.time()))
        if updated is None:
            return
        if updated.cancel_requested:
            await self._finish_cancel(job_id)
            return
        await self.jobs.requeue(job_id, pending_score_of(updated))
        await self.events.publish(updated, "requeued")

    async def _stop_now(self, record: JobRecord, pods: list[PodRecord], skip: set[str]) -> None:
        """Stop pods at once (each by its own token); a node that did not answer may only be stalled: it
        gets a stop it must find behind the start, without waiting for an answer."""
        job_id = record.job_id
        await asyncio.gather(*[
            self._send(pod.node or "", StopPod(job_id=job_id, pod=agent_pod_id(pod.name, pod_token(record, pod)),
                                               grace_s=0, reason="rollback"))
            for pod in pods if pod.node not in skip
        ])
        for pod in pods:
            if pod.node in skip:
                await self._tell(pod.node or "", StopPod(
                    job_id=job_id, pod=agent_pod_id(pod.name, pod_token(record, pod)), grace_s=0, reason="rollback"))

    async def _rollback_extras(self, record: JobRecord, attempt: int, why: str, bad_nodes: list[str]) -> None:
        """Undo an attempt that placed only elastic extras: stop and release those pods; the job keeps
        running on its gang and the extras want placement again."""
        job_id = record.job_id
        log.warning("extras_rollback", job_id=job_id, attempt=attempt, reason=why, bad_nodes=bad_nodes)
        skip = set(bad_nodes)
        pods = [p for p in record.pods if p.node and pod_token(record, p) == attempt]
        await self._stop_now(record, [p for p in pods if p.state not in POD_DONE_STATES], skip)
        resv = record.reservation if record.reservation == keys.reservation_id(job_id, attempt) else ""
        await self.claims.release([keys.claim(job_id, p.name) for p in pods], resv)
        attempt_resv = keys.reservation_id(job_id, attempt)
        updated = await self._update(job_id, lambda r: rollback_extras(r, attempt, attempt_resv, skip))
        if updated is not None:
            await self.events.publish(updated, "extras-requeued", reason=f"elastic extras: {why}")
            self._kick.set()

    # ------------------------------------------------------------ stopping
    async def _process_stop_requests(self, job_ids: list[str] | None = None) -> None:
        for job_id in await self.jobs.stop_requests() if job_ids is None else job_ids:
            record = await self.jobs.get(job_id)
            if record is None:
                await self.jobs.stop_done(job_id)
                continue
            live = [p for p in record.pods if p.node and p.state not in POD_DONE_STATES]
            if not live:
                await self.jobs.stop_done(job_id)
                if record.cancel_requested and record.state not in TERMINAL_STATES:
                    await self._finish_cancel(job_id)
                elif record.state == JobState.PREEMPTED:
                    await self._requeue_preempted(job_id)
                continue
            grace = record.spec.spec.grace_period_s
            for pod in live:
                token = pod_token(record, pod)
                err = await self._send(pod.node or "", StopPod(
                    job_id=job_id, pod=agent_pod_id(pod.name, token), grace_s=grace,
                    reason=record.reason or "stop"))
                if err:  # the node is gone: the pod is as good as stopped
                    await self._pod_exited(PodExited(
                        node_id=pod.node or "", job_id=job_id, pod=agent_pod_id(pod.name, token),
                        exit_code=None, reason=ExitReason.STOPPED, message=err))

    async def _finish_cancel(self, job_id: str) -> None:
        updated = await self._update(job_id, lambda r: finish_cancel(r, time.time()))
        if updated is not None:
            await self.jobs.dequeue(job_id)
            await self.events.publish(updated, "cancelled")

    # ------------------------------------------------------------ node agents
    async def _on_node_status(self, msg: Msg) -> None:
        """Handled only while leading: otherwise (or when a script is fenced midway) the message is nak'ed
        and goes to the leader."""
        if not self.leading():
            raise NotLeading("a standby placer does not handle node status")
        try:
            await self._handle_node_status(msg)
        except FencedOut as exc:
            await self._step_down(str(exc))
            raise

    async def _handle_node_status(self, msg: Msg) -> None:
        try:
            status = NODE_STATUS.validate_json(msg.data)
        except ValueError as exc:
            log.warning("bad_node_status", subject=msg.subject, error=str(exc))
            await msg.term()
            return
        sender = msg.subject.split(".")[2]
        named = [status.node.node_id] if isinstance(status, NodeRegistered) else [status.node_id]
        if isinstance(status, PodStatusBatch):
            named += [item.node_id for item in status.items]
        if any(n != sender for n in named):
            log.warning("node_status_id_mismatch", subject=msg.subject)
            await msg.term()
            return
        if isinstance(status, NodeRegistered):
            await self._node_registered(status)
        elif isinstance(status, PodStatusBatch):
            await self._pod_transitions(status.items)
        else:
            await self._pod_transition(status)
        await msg.ack()

    async def _pod_transitions(self, items: list[PodStarted | PodExited]) -> None:
        """A node's batch of pod transitions: each job's in the order they happened, different jobs at once. A
        batch that fails midway is redelivered whole; what was applied already changes nothing again."""
        by_job: dict[str, list[PodStarted | PodExited]] = {}
        for item in items:
            by_job.setdefault(item.job_id, []).append(item)

        async def in_order(job_items: list[PodStarted | PodExited]) -> None:
            for item in job_items:
                await self._pod_transition(item)

        await concurrently([in_order(job_items) for job_items in by_job.values()])

    async def _pod_transition(self, status: PodStarted | PodExited) -> None:
        if isinstance(status, PodStarted):
            await self._pod_started(status)
        else:
            await self._pod_exited(status)

    async def _node_registered(self, reg: NodeRegistered) -> None:
        node = reg.node
        await self.claims.set_capacity(node)
        self.view.invalidate()
        was_lost = bool(await self.redis.srem(keys.LOST_NODES, node.node_id))
        self._rescheduled.discard(node.node_id)
        self.last_seen[node.node_id] = time.time()
        lease = {k: v for k, v in (("lease_s", reg.lease_s), ("fence_grace_s", reg.fence_grace_s),
                                   ("heartbeat_s", reg.heartbeat_s)) if v is not None}
        self.leases[node.node_id] = lease
        await self.redis.hset(keys.NODE_LEASES, node.node_id, json.dumps(lease))
        log.info("node_registered", node_id=node.node_id, gpus=len(node.gpus), running=len(reg.running_pods))
        # Pods we placed on this node that the agent no longer runs ended as it says (their PodExited may
        # still be on its way: exits are applied per job, concurrently with this), or else are lost.
        # A registration can be old by the time it is handled (an agent re-registers when it reconnects, and
        # the message waits out a JetStream election): a pod started since is missing from it, so a missing
        # pod is asked after (SettlePod) before it is called lost.
        running = set(reg.running_pods)
        exited = {f"{e.job_id}/{e.pod}": e for e in reg.exited}
        missing = [(job_id, agent_pod_id(pod, attempt)) for job_id, pod, attempt in await self._pods_on(node.node_id)
                   if f"{job_id}/{agent_pod_id(pod, attempt)}" not in running]
        to_ask = [(job_id, pod) for job_id, pod in missing if f"{job_id}/{pod}" not in exited]
        answers = await asyncio.gather(*[
            self._request(node.node_id, SettlePod(job_id=job_id, pod=pod), SETTLE_ASK_S / 2) for job_id, pod in to_ask])
        answered = {f"{job_id}/{pod}": ack for (job_id, pod), ack in zip(to_ask, answers, strict=True)}
        for job_id, pod in missing:
            key = f"{job_id}/{pod}"
            ack = answered.get(key)
            if ack is not None and ack.fate == PodFate.RUNNING:
                continue  # started after the registration was written
            await self._pod_exited(exited.get(key) or (ack.exited if ack else None) or PodExited(
                node_id=node.node_id, job_id=job_id, pod=pod, exit_code=None,
                reason=ExitReason.LOST, message="node agent restarted without it"))
        # ... and pods the agent runs that are not the current attempt of their job are stopped.
        self.reported[node.node_id] = frozenset(running)
        self.reported_at[node.node_id] = reg.ts  # the list's time: the registration's, on the agent's clock
        if await self._fence_node(node.node_id, running, fresh=True) and was_lost:
            await self.redis.sadd(keys.LOST_NODES, node.node_id)  # back once its heartbeats show it fenced
        self._kick.set()

    async def _pods_on(self, node_id: str) -> list[tuple[str, str, int]]:
        """(job, pod, attempt) of the started pods the placer holds on a node."""
        out = []
        for claim_key, alloc in (await self.claims.all_claims()).items():
            if alloc.get("node_id") != node_id:
                continue
            job_id, pod = keys.parse_claim(claim_key)
            record = await self.jobs.get(job_id)
            pod_rec = next((p for p in record.pods if p.name == pod), None) if record else None
            if record and pod_rec and pod_rec.state == PodState.RUNNING:
                out.append((job_id, pod, pod_token(record, pod_rec)))
        return out

    def reschedule_after(self, node_id: str) -> float:
        """Silence after which a lost node's pods are rescheduled: never before the agent has stopped them
        itself (its lease, the fence grace and a heartbeat of slack for its lease check), and never before
        the node counts as lost."""
        lease = self.leases.get(node_id, {})
        heartbeat = lease.get("heartbeat_s") or self.settings.heartbeat_s
        fenced_by = ((lease.get("lease_s") or self.settings.node_lease_s)
                     + (lease.get("fence_grace_s") or self.settings.fence_grace_s) + 2 * heartbeat)
        return max(self.settings.node_lost_after_s, fenced_by)

    async def _detect_lost_nodes(self) -> bool:
        """A node whose heartbeats stopped for ``TIDE_NODE_LOST_AFTER_S`` is lost (no new pods); once the
        silence is past its lease + fence grace (the agent has stopped its pods itself) its pods' jobs are
        requeued whole. A lost node that heartbeats again comes back once it runs no stale pod. Returns whether
        it changed anything (a node lost or back, pods requeued)."""
        now = time.time()
        window = self.settings.node_lost_after_s
        if not self.nc.is_connected:
            self._deaf = True  # what this placer cannot hear says nothing about the nodes
            return False
        if self._deaf:  # reconnected: every node gets a fresh window
            self._deaf = False
            log.info("placer_reconnected_windows_reset", nodes=len(self.last_seen))
            for node_id in self.last_seen:
                self.last_seen[node_id] = now
        if now - self.started_at < window or now - self._lost_checked_at < LOST_CHECK_EVERY_S:
            return False
        self._lost_checked_at = now
        changed = False
        lost = set(await self.redis.smembers(keys.LOST_NODES))
        for node_id in await self.redis.smembers(keys.NODES):
            seen = self.last_seen.setdefault(node_id, self.started_at)
            silent = now - seen
            if silent < window:
                if node_id in lost:
                    await self._node_back(node_id)
                    changed = True
                continue
            if node_id not in lost:
                log.warning("node_lost", node_id=node_id, silent_s=round(silent, 1))
                await self.redis.sadd(keys.LOST_NODES, node_id)
                changed = True
                self.metrics.node_lost()
                self.view.invalidate()
            after = self.reschedule_after(node_id)
            if silent < after or node_id in self._rescheduled:
                continue
            self._rescheduled.add(node_id)
            changed = True
            pods = await self._pods_on(node_id)
            log.warning("node_pods_rescheduled", node_id=node_id, silent_s=round(silent, 1), pods=len(pods))
            for job_id, pod, attempt in pods:
                await self._pod_exited(PodExited(
                    node_id=node_id, job_id=job_id, pod=agent_pod_id(pod, attempt), exit_code=None,
                    reason=ExitReason.LOST,
                    message=f"node {node_id} lost (no heartbeat for {silent:.0f}s, past its lease)"))
        return changed

    async def _node_back(self, node_id: str) -> None:
        """A lost node heartbeats again: it takes pods again once it runs none that is stale (fenced)."""
        reported = self.reported.get(node_id)
        if reported is None:
            return  # an agent without the pods header: only a registration brings it back
        stale = await self._fence_node(node_id, reported, fresh=True)
        if stale:
            log.info("node_back_fencing", node_id=node_id, stale=stale)
            return
        await self.redis.srem(keys.LOST_NODES, node_id)
        self._rescheduled.discard(node_id)
        self.view.invalidate()
        log.info("node_back", node_id=node_id)

    # ------------------------------------------------------------ fencing
    async def _fence_reported(self) -> None:
        """Stop every pod an agent reports that is not its job's current attempt (reverse reconciliation):
        the nodes whose report changed, and every node each ``FENCE_SWEEP_S``."""
        now = time.monotonic()
        if now - self._fence_swept_at >= FENCE_SWEEP_S:
            self._fence_swept_at = now
            nodes = set(self.reported)
        else:
            nodes = {n for n in self._fence_dirty if n in self.reported}  # not a set of every node per cycle
        self._fence_dirty -= nodes
        for node_id in sorted(nodes):
            await self._fence_node(node_id, self.exit_reports.still_listed(
                node_id, self.reported[node_id], self.reported_at.get(node_id)))

    async def _fence_node(self, node_id: str, pods: frozenset[str] | set[str], fresh: bool = False) -> list[str]:
        """Stop the stale pods among ``pods`` (as an agent reports them) on a node; returns their keys.

        The view's copy of a record may be out of date, so a pod it calls stale is judged again on the
        record in Redis before it is stopped."""
        stale = []
        for key in sorted(pods):
            job_id, _, agent_pod = key.partition("/")
            pod, attempt = parse_agent_pod_id(agent_pod)
            record = None if fresh else self.view.record(job_id)
            if record is not None and pod_is_current(record, pod, attempt, node_id):
                continue
            record = await self.jobs.get(job_id)
            if pod_is_current(record, pod, attempt, node_id):
                continue
            stale.append(key)
            now = time.monotonic()
            if now - self._fence_sent.get(key, -FENCE_RESEND_S) < FENCE_RESEND_S:
                continue
            self._fence_sent[key] = now
            current = record.attempts if record else None
            log.warning("stale_pod_stopped", job_id=job_id, node_id=node_id, pod=agent_pod, attempt=attempt,
                        current_attempt=current)
            await self._tell(node_id, StopPod(job_id=job_id, pod=agent_pod, grace_s=0,
                                              reason=f"stale attempt {attempt} (current: {current})"))
        if len(self._fence_sent) > 10_000:
            cutoff = time.monotonic() - FENCE_RESEND_S
            self._fence_sent = {k: t for k, t in self._fence_sent.items() if t > cutoff}
        return stale

    async def _pod_started(self, started: PodStarted) -> None:
        pod, attempt = parse_agent_pod_id(started.pod)
        if _already_started(self.view.record(started.job_id), pod, attempt, started.node_id):
            return  # recorded when its start was answered (a pod's state only moves on under one token)
        turned: list[bool] = []
        already: list[bool] = []

        def change(r: JobRecord) -> bool:
            turned.clear()
            already.clear()
            if _already_started(r, pod, attempt, started.node_id):
                already.append(True)
                return False
            outcome = pod_started(r, pod, attempt, started.node_id, time.time())
            if outcome is not None:
                turned.append(outcome)
            return outcome is not None

        record = await self._update(started.job_id, change)
        if already:
            return
        if record is None:  # an attempt that is over (rolled back, requeued): that pod must not run
            await self._fence_node(started.node_id, {f"{started.job_id}/{started.pod}"}, fresh=True)
            return
        await self._started_events(record, [(pod, started.node_id)], bool(turned and turned[-1]))

    async def _pod_exited(self, exited: PodExited) -> None:
        if exited.reason != ExitReason.LOST:  # its agent said so: a heartbeat list from before is out of date
            self.exit_reports.note(exited.node_id, transition_key(exited), exited.ts, time.monotonic())
        pod, attempt = parse_agent_pod_id(exited.pod)
        record = self.view.record(exited.job_id)
        if exited.reason == ExitReason.LOST or not accepts_exit(record, pod, attempt, exited.node_id):
            # judged on what Redis holds (the view's copy may be out of date), with the other such exits of
            # this turn: one read
            record = await self._records_batch(exited.job_id)
        if not accepts_exit(record, pod, attempt, exited.node_id):
            return  # not the current token (an attempt rolled back, a pod already counted): changes nothing
        assert record is not None
        # a lost elastic extra of a running job is not rolled back with its job: it wants placement again
        extra = next(p.index for p in record.pods if p.name == pod) >= record.spec.spec.gang_size
        lost_extra = extra and record.state == JobState.RUNNING
        if (exited.reason == ExitReason.LOST and not lost_extra and not record.cancel_requested
                and record.state not in TERMINAL_STATES):
            await self._rollback(exited.job_id, attempt, f"pod {pod} lost: {exited.message}", [exited.node_id])
            return
        outcome: list[tuple[JobState | None, list[str]]] = []
        named = exited.model_copy(update={"pod": pod})

        def change(r: JobRecord) -> bool:
            result = pod_exited(r, named, attempt, time.time())
            if result is not None:
                outcome.append(result)
            return result is not None

        # the exit recorded and the pod's claim released in one step (a compare-and-set on the record): never
        # the claim of an attempt the record has moved past; with the other exits of this turn: one script
        record = await self._update(exited.job_id, change,
                                    write=self._exit_write(exited.job_id, (keys.claim(exited.job_id, pod),)))
        self._kick.set()
        if record is None:
            return
        new_state, to_stop = outcome[-1]
        one_pod = len(record.pods) == 1 and new_state is not None
        if not one_pod:  # a one-pod job's terminal event says the same: its pod, node and exit code
            await self.events.publish(record, "pod-exited", pod=pod, node=exited.node_id,
                                      exit_code=exited.exit_code, reason=exited.reason.value)
        if new_state is not None:
            log.info("job_finished", job_id=record.job_id, state=new_state, reason=record.reason)
            if one_pod:
                await self.events.publish(record, new_state.value, pod=pod, node=exited.node_id,
                                          exit_code=exited.exit_code)
            else:
                await self.events.publish(record, new_state.value)
        if to_stop:
            await self.jobs.request_stop(record.job_id)
        if record.state == JobState.PREEMPTED and not any(p.node and p.state not in POD_DONE_STATES
                                                          for p in record.pods):
            await self._requeue_preempted(record.job_id)

    # ------------------------------------------------------------ API
    async def _api_nodes(self, msg: Msg) -> None:
        nodes = await self.claims.nodes()
        lost = set(await self.redis.smembers(keys.LOST_NODES))
        now = time.time()
        out = []
        for n in nodes:
            used = await self.claims.used(n.node_id)
            out.append({
                "node_id": n.node_id,
                "labels": n.labels,
                "rack": n.rack,
                "gpus": len(n.gpus),
                "gpu_models": sorted({g.model for g in n.gpus}),
                "gpus_used_milli": sum(used.get(f"g{g.index}.milli", 0) for g in n.gpus),
                "cpu_used_milli": used.get("cpu", 0),
                "cpu_milli": n.cpu_milli,
                "lost": n.node_id in lost,
                "last_seen_s": round(now - self.last_seen[n.node_id], 1) if n.node_id in self.last_seen else None,
            })
        leader = await self.lease.holder_now()  # the active placer's token (also in Redis: keys.PLACER_LEADER)
        await msg.respond(json.dumps({"nodes": out, "placer_leader": leader}).encode())


class NotLeading(FencedOut):
    """This placer does not hold the leader lease (by its own deadline): it acts as if fenced."""


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of ``waits`` is done; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


async def _in_span(span: trace.Span, step: Coroutine[Any, Any, None]) -> None:
    """``step`` with ``span`` current (not ended here)."""
    with trace.use_span(span, record_exception=False, set_status_on_exception=False):  # the caller logs it
        await step


async def _set_when(target: asyncio.Event, *events: asyncio.Event) -> None:
    """Set ``target`` once any of ``events`` is set."""
    await _first(*[e.wait() for e in events])
    target.set()


committed = commit  # the transition's former name here (``tide.core.lifecycle.commit``)


def status_order_key(msg: Msg) -> str:
    """Status messages of one job are handled in order; different jobs (and nodes) concurrently."""
    try:
        body = json.loads(msg.data)
    except ValueError:
        return msg.subject
    return str(body.get("job_id") or msg.subject)


def _already_started(record: JobRecord | None, pod: str, attempt: int, node: str) -> bool:
    """The pod of this token on this node is recorded started (running or done) already."""
    if record is None or not accepts_start(record, pod, attempt, node):
        return False
    p = next(p for p in record.pods if p.name == pod)
    return p.state not in (PodState.PENDING, PodState.STARTING)


def start_error(ack: CommandAck | None) -> str:
    """'' for an acknowledged command, else why not (an agent's refusal, or no answer at all)."""
    if ack is None:
        return "no acknowledgement"
    return "" if ack.ok else (ack.error or "refused")


def placeable(record: JobRecord) -> bool:
    return record.state in PLACEABLE and not record.cancel_requested


def pending_score_of(record: JobRecord) -> float:
    return pending_score(record.spec.metadata.priority_class, record.submitted_at)


def gpu_assignments(node: NodeDescription, alloc: Allocation) -> list[GpuAssignment]:
    """What the node agent is told to expose: GPU UUIDs (or the MIG instance) with their limits."""
    uuids = {g.index: g.uuid or f"GPU-{node.node_id}-{g.index}" for g in node.gpus}
    out = [
        GpuAssignment(index=i, uuid=uuids[i], milli=m, memory_mib=mem)
        for i, m, mem in zip(alloc.gpu_indices, alloc.gpu_milli, alloc.gpu_mem_mib, strict=True)
    ]
    if alloc.mig is not None:
        mig = alloc.mig
        out.append(GpuAssignment(
            index=mig.gpu_index,
            uuid=f"MIG-{uuids[mig.gpu_index]}/{mig.profile}/{mig.start}",
            milli=0,
            mig_profile=mig.profile,
            mig_start=mig.start,
            mig_create=mig.repartition,
        ))
    return out
