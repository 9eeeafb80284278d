"""The metrics service: job events and telemetry in, Prometheus metrics out (OpenTelemetry SDK)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog
from nats.aio.msg import Msg
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import start_http_server
from tide import subjects
from tide.bus.nats import close_nats, connect, consume, ensure_streams
from tide.schemas.events import GpuSample, JobEvent, Telemetry
from tide.settings import Settings

log = structlog.get_logger()
WAIT_BUCKETS_S = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600]


class MetricsService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.gpus: dict[tuple[str, int], GpuSample] = {}

    async def start(self) -> None:
        start_http_server(self.settings.metrics_port, addr=self.settings.metrics_host)
        provider = MeterProvider(
            resource=Resource.create({"service.name": "tide-metrics"}), metric_readers=[PrometheusMetricReader()]
        )
        meter = provider.get_meter("tide.metrics")
        self.job_events = meter.create_counter("tide_job_events", unit="1", description="job lifecycle events")
        self.queue_wait = meter.create_histogram(
            "tide_queue_wait", unit="s", description="submit to placement wait",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS_S,
        )
        meter.create_observable_gauge("tide_gpu_utilization_ratio", [self._observe("utilization_ratio")],
                                      unit="1", description="GPU utilisation (0-1)")
        meter.create_observable_gauge("tide_gpu_memory_used_bytes", [self._observe("memory_used_bytes")],
                                      unit="By", description="GPU memory used")
        self.nc = await connect(self.settings, "tide-metrics")
        self.js = self.nc.jetstream()
        await ensure_streams(self.js)

    def _observe(self, attr: str):
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for (node_id, index), sample in list(self.gpus.items()):
                yield Observation(getattr(sample, attr), {"node": node_id, "gpu": str(index)})

        return callback

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(
            consume(self.js, subjects.METRICS_EVENTS, self._on_event, stop),
            consume(self.js, subjects.METRICS_TELEMETRY, self._on_telemetry, stop),
        )

    async def close(self) -> None:
        await close_nats(self.nc)

    async def _on_event(self, msg: Msg) -> None:
        try:
            event = JobEvent.model_validate_json(msg.data)
        except ValueError:
            await msg.term()
            return
        attrs = {"kind": event.kind, "queue": event.queue or "", "priority_class": event.priority_class or ""}
        self.job_events.add(1, attrs)
        if event.kind == "placed" and event.wait_s is not None:
            self.queue_wait.record(event.wait_s, attrs)
        await msg.ack()

    async def _on_telemetry(self, msg: Msg) -> None:
        try:
            t = Telemetry.model_validate_json(msg.data)
        except ValueError:
            await msg.term()
            return
        for sample in t.gpus:
            self.gpus[(t.node_id, sample.index)] = sample
        await msg.ack()
