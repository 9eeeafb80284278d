"""Process scaffolding shared by every service: settings, logging, tracing, signals, readiness."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from tide.log import configure_logging
from tide.settings import Settings
from tide.tracing import configure_tracing


class Service(Protocol):
    async def start(self) -> None: ...
    async def run(self, stop: asyncio.Event) -> None: ...
    async def close(self) -> None: ...


async def concurrently(aws: list[Awaitable[object]]) -> None:
    """Await ``aws`` concurrently (``asyncio.gather``: the first exception propagates); one alone is awaited in
    place, without a task of its own (most message batches a consumer takes at a time hold one group)."""
    if len(aws) == 1:
        await aws[0]
    elif aws:
        await asyncio.gather(*aws)


def run_service(name: str, factory: Callable[[Settings], Service]) -> None:
    """Run a service until SIGTERM/SIGINT, then drain and close it."""
    settings = Settings()
    configure_logging(name, settings.log_format, settings.log_level)
    configure_tracing(name, settings.otlp_endpoint)
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        runner.run(_main(name, settings, factory))


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop (``TIDE_EVENT_LOOP=uvloop``, the default) where it is installed: the loop's own work
    (ready callbacks, selecting, socket writes) runs in C. The same code on each loop, 1,000 nodes at 400 jobs/s:
    about 4 % less CPU per job across the stack, the queue and metrics most (docs/benchmarks.md, issue 17 seventh
    round). None (asyncio's own loop) for ``asyncio`` or where uvloop is missing."""
    if choice != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _main(name: str, settings: Settings, factory: Callable[[Settings], Service]) -> None:
    log = structlog.get_logger().bind(service=name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service = factory(settings)
    gc.set_threshold(*GC_THRESHOLDS)
    await service.start()
    freeze_long_lived()
    if settings.ready_file is not None:
        settings.ready_file.parent.mkdir(parents=True, exist_ok=True)
        settings.ready_file.write_text("ready\n")
    log.info("service_ready", event_loop=type(loop).__module__.split(".")[0])
    try:
        await service.run(stop)
    finally:
        log.info("service_stopping")
        await service.close()
        log.info("service_stopped")


GC_THRESHOLDS = (700, 10, 100)
"""The cyclic garbage collector's thresholds in every service: CPython's defaults but a full collection after 100
collections of the middle generation instead of 10. A full pass walks every live object (at 400 jobs/s the
placer holds ~100,000 for its jobs in flight) and found nothing to free; with the default it ran ~every 1.5 s for
50-180 ms, stalling the event loop (22 in a 35 s run; 4 with this setting, at most 60 ms). Garbage in reference
cycles is still collected, only later."""


def freeze_long_lived() -> None:
    """Leave what lives now out of the cyclic garbage collector's later passes (``gc.freeze``): a service's
    modules, classes and connections, and whatever long-lived state it just built. Each full collection otherwise
    walks them all again, finding nothing to free: at 1,000 nodes that was a 50-170 ms stall of the event loop
    every few seconds in the placer and metrics, the tail of submit -> placed. Objects frozen are still freed
    by reference counting when dropped; only a reference cycle among them would be kept."""
    gc.collect()
    gc.freeze()


async def every(period_s: float, stop: asyncio.Event, fn: Callable[[], Awaitable[None]]) -> None:
    """Call ``fn`` every ``period_s`` until ``stop``; an exception is logged, not fatal."""
    log = structlog.get_logger()
    while not stop.is_set():
        try:
            await fn()
        except Exception as exc:
            log.exception("periodic_task_failed", error=repr(exc))
        try:
            await asyncio.wait_for(stop.wait(), timeout=period_s)
        except TimeoutError:
            pass
