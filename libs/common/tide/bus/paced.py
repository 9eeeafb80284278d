"""A NATS connection read in batches: its socket is read at most once every ``interval_s``.

A process that sleeps in the event loop is woken by each message on its sockets, and on a virtual machine the
wake-up costs more than handling a small message (docs/benchmarks.md, issue 17 eleventh round). The node agents'
heartbeats come one by one (1,000 nodes: 500 a second, each on its own timer), so a service that takes them
on a connection read as they come wakes 500 times a second for them. Read every 50 ms, the same heartbeats
cost 20 wake-ups a second: the kernel keeps them in the socket's buffer meanwhile, and one read takes them all.

Only for connections whose messages may wait ``interval_s`` (telemetry): a request, a reply or a
JetStream acknowledgement on one waits as long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from tide.bus.nats import Readable, close_nats, connect, socket_transport
from tide.settings import Settings

log = structlog.get_logger()


class PacedReading:
    """Reads ``nc``'s socket at most once every ``interval_s``: once a read brought a message (``handler``), it
    stops reading for ``interval_s``, then reads again and the next data wakes it (every message, in order:
    nothing is dropped, each waits at most ``interval_s`` more). Follows the connection across reconnects;
    ``stop`` reads as usual again."""

    def __init__(self, nc: NATS, interval_s: float) -> None:
        self.nc, self.interval_s = nc, interval_s
        self._paused: Readable | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = interval_s <= 0
        self.pauses = 0  # how many times reading stopped (tests)
        if not self._stopped and socket_transport(nc) is None:
            log.warning("paced_reading_unavailable", client=nc.options.get("name"))

    def handler(self, cb: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        """``cb`` for a subscription on ``nc``: each message it gets pauses the reading (unless paused)."""

        async def paced(msg: Msg) -> None:
            self._read()
            await cb(msg)

        return paced

    def stop(self) -> None:
        self._stopped = True
        self._resume()

    def _read(self) -> None:
        """A read brought a message: stop reading (the rest of that read is handled all the same)."""
        if self._stopped or self._timer is not None or self.nc.is_closed:
            return
        transport = socket_transport(self.nc)
        if transport is None or transport.is_closing():
            return
        transport.pause_reading()
        self._paused = transport
        self.pauses += 1
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._resume)

    def _resume(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        paused, self._paused = self._paused, None
        if paused is not None and not paused.is_closing():
            paused.resume_reading()


class PacedConnection:
    """A NATS connection of its own whose subscriptions are read in batches (``PacedReading``): for what may wait
    ``interval_s``, kept apart from a service's main connection, which is read as messages come."""

    def __init__(self, nc: NATS, interval_s: float) -> None:
        self.nc = nc
        self.reading = PacedReading(nc, interval_s)

    @classmethod
    async def open(cls, settings: Settings, name: str, interval_s: float) -> PacedConnection:
        return cls(await connect(settings, name), interval_s)

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]]) -> Subscription:
        return await self.nc.subscribe(subject, cb=self.reading.handler(cb))

    async def close(self) -> None:
        """Read as usual again (what is in flight is taken at once), then flush and close."""
        self.reading.stop()
        await close_nats(self.nc)
