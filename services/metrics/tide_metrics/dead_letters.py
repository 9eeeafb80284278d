"""``tide_dead_letters_total{consumer}``: messages a service's handler gave up on (``tide.bus.dead_letters``).

The metrics service reads the ``DLQ`` stream with its own durable consumer (``metrics-dead-letters``) and counts
each dead letter by the consumer that gave it up. The count starts at 0 when the service starts (a Prometheus
counter reset); the stream keeps the letters themselves (``tide describe JOB`` shows a job's).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from tide import subjects
from tide.bus.dead_letters import DeadLetter
from tide.bus.nats import consume

log = structlog.get_logger()
CONSUMERS = (subjects.QUEUE_INTAKE, subjects.PLACER_NODE_STATUS, subjects.METRICS_EVENTS)


class DeadLetterCounter:
    def __init__(self, meter: Any) -> None:
        self.counter = meter.create_counter(
            "tide_dead_letters", unit="1",
            description="messages a service's handler failed on too often, moved to the DLQ stream, by consumer")
        for cdef in CONSUMERS:  # a series from the start, so rates and alerts have one
            self.counter.add(0, {"consumer": cdef.durable})

    async def on_letter(self, msg: Msg) -> None:
        """Count it and ack it; never raises (a failure here would dead-letter into the stream it reads)."""
        letter = DeadLetter.from_headers(msg.headers)
        self.counter.add(1, {"consumer": letter.consumer if letter else "unknown"})
        try:
            await msg.ack()
        except Exception as exc:  # noqa: BLE001 - redelivered and counted again: a counter may overcount
            log.warning("dead_letter_ack_failed", error=repr(exc))

    async def run(self, js: JetStreamContext, stop: asyncio.Event) -> None:
        await consume(js, subjects.METRICS_DEAD_LETTERS, self.on_letter, stop)
