"""The placer's own Prometheus metrics (OpenTelemetry SDK + Prometheus exporter, as the metrics service).

Served on ``http://TIDE_PLACER_METRICS_HOST:TIDE_PLACER_METRICS_PORT/metrics`` (port 0: not served) from a registry
of its own, so several placers (or tests) in one process never share series. The service calls the hooks
(``timed_cycle``, ``observe_plan``, ``reservation``, ``node_lost``); what they derive from a plan is pure
(``pending_by_reason``, ``preemption_reason``). Names and meanings: docs/observability.md, "The placer's metrics".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager

import structlog
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, start_http_server
from tide.cli.describe import reason_code
from tide.core.cycle import CycleState
from tide.core.cycle_context import Plan
from tide.schemas.events import JobState

log = structlog.get_logger()
CYCLE_BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
RESULTS = ("reserved", "conflict", "unfit", "unschedulable")
"""placement attempts: the gang's slots reserved; Redis refused them or the job changed meanwhile (a stale view);
the plan found no room now; it can never fit"""
PREEMPTION_REASONS = ("priority", "guarantee", "fair_share", "tide", "consolidation", "other")


def preemption_reason(by: str, why: str) -> str:
    """A low-cardinality label for the planner's reason text (``tide.core.preempt``, ``tidal``, ``consolidate``)."""
    if by == "tide" or why.startswith(("tidal", "its pool takes its lent nodes back")):
        return "tide"
    if why.startswith("consolidation"):
        return "consolidation"
    if why.startswith("priority"):
        return "priority"
    if why.startswith("reclaiming its queue's guarantee"):
        return "guarantee"
    if why.startswith("fair-share"):
        return "fair_share"
    return "other"


def pending_by_reason(state: CycleState, plan: Plan) -> Counter[tuple[str, str]]:
    """(queue, reason code) -> pending jobs after this plan: the jobs it did not bind, each with the reason it
    gives now (``tide.cli.describe.reason_code``, the codes ``tide describe`` shows)."""
    bound = {b.record.job_id for b in plan.binds}
    gone = bound | {t.record.job_id for t in plan.timed_out}
    unfit = {r.job_id: u for r, u in plan.not_placed}
    out: Counter[tuple[str, str]] = Counter()
    for record in state.pending:
        job_id = record.job_id
        if job_id in gone:
            continue
        if job_id in plan.nominations:
            state_name, reason = JobState.PENDING.value, plan.nominations[job_id]
        elif job_id in unfit:
            u = unfit[job_id]
            state_name, reason = (JobState.PENDING if u.resolvable else JobState.UNSCHEDULABLE).value, u.reason
        else:
            state_name, reason = record.state.value, record.reason
        out[(record.spec.metadata.queue, reason_code("", state_name, reason))] += 1
    return out


class PlacerMetrics:
    def __init__(self, last_seen: Callable[[], Mapping[str, float]], service: str = "tide-placer") -> None:
        """``last_seen``: node id -> time.time() of its last heartbeat (the placer's table)."""
        self.registry = CollectorRegistry()
        self._last_seen = last_seen
        self._pending: Counter[tuple[str, str]] = Counter()
        self._planned = False
        provider = MeterProvider(resource=Resource.create({"service.name": service}),
                                 metric_readers=[PrometheusMetricReader(registry=self.registry)])
        meter = provider.get_meter("tide.placer")
        self.cycle_duration = meter.create_histogram(
            "tide_placer_cycle_duration", unit="s", description="one scheduling cycle: reconcile, stops, plan, reserve",
            explicit_bucket_boundaries_advisory=CYCLE_BUCKETS_S)
        self.attempts = meter.create_counter(
            "tide_placer_placement_attempts", unit="1", description="placement attempts of pending jobs, by result")
        self.preemptions = meter.create_counter(
            "tide_placer_preemptions", unit="1", description="preemptions the planner decided, by reason")
        self.nodes_lost = meter.create_counter(
            "tide_placer_nodes_lost", unit="1", description="nodes declared lost (no heartbeat for the window)")
        for result in RESULTS:  # a series from the start, so rates and alerts have one
            self.attempts.add(0, {"result": result})
        for reason in PREEMPTION_REASONS:
            self.preemptions.add(0, {"reason": reason})
        self.nodes_lost.add(0)
        meter.create_observable_gauge(
            "tide_placer_pending_jobs", [self._pending_jobs], unit="{job}",
            description="jobs waiting after the last cycle that planned, by queue and reason code")
        meter.create_observable_gauge(
            "tide_placer_node_heartbeat_age_seconds", [self._heartbeat_age], unit="s",
            description="seconds since each node's last heartbeat")

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics (a thread of prometheus_client's); port 0: not served."""
        if not port:
            return
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:  # a port taken must not keep the placer from placing
            log.error("placer_metrics_not_served", host=host, port=port, error=str(exc))
            return
        log.info("placer_metrics_serving", host=host, port=port)

    # ------------------------------------------------------------ hooks
    @asynccontextmanager
    async def timed_cycle(self) -> AsyncIterator[None]:
        started = time.perf_counter()
        self._planned = False
        try:
            yield
        finally:
            self.cycle_duration.record(time.perf_counter() - started)
            if not self._planned:  # nothing pending to plan for (or no nodes): nothing waits on a reason
                self._pending = Counter()

    def observe_plan(self, state: CycleState, plan: Plan) -> None:
        self._planned = True
        self._pending = pending_by_reason(state, plan)
        for _record, unfit in plan.not_placed:
            self.attempts.add(1, {"result": "unfit" if unfit.resolvable else "unschedulable"})
        for p in plan.preemptions:
            self.preemptions.add(1, {"reason": preemption_reason(p.by, p.why)})

    def reservation(self, reserved: bool) -> None:
        self.attempts.add(1, {"result": "reserved" if reserved else "conflict"})

    def node_lost(self) -> None:
        self.nodes_lost.add(1)

    # ------------------------------------------------------------ observations
    def _pending_jobs(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"queue": q, "reason": code}) for (q, code), n in list(self._pending.items())]

    def _heartbeat_age(self, options: CallbackOptions) -> Iterable[Observation]:
        now = time.time()
        return [Observation(max(0.0, now - seen), {"node": node}) for node, seen in list(self._last_seen().items())]
