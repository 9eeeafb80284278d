"""Every service runs with the garbage-collector settings of ``tide.runtime`` (issue 17: full collections were the
event loop's longest stalls): rarer full passes, and what lives at start-up frozen out of them."""

from __future__ import annotations

import asyncio
import gc

from tide import runtime
from tide.settings import Settings


class _Service:
    def __init__(self, settings: Settings) -> None:
        self.seen: tuple[tuple[int, int, int], int] | None = None

    async def start(self) -> None:
        self.long_lived = [object() for _ in range(10)]

    async def run(self, stop: asyncio.Event) -> None:
        self.seen = (gc.get_threshold(), gc.get_freeze_count())

    async def close(self) -> None:
        pass


def test_a_service_runs_with_rare_full_collections_and_its_start_up_state_frozen() -> None:
    before = gc.get_threshold()
    services: list[_Service] = []

    def factory(settings: Settings) -> _Service:
        services.append(_Service(settings))
        return services[0]

    try:
        gc.unfreeze()
        asyncio.run(runtime._main("test", Settings(), factory))
        threshold, frozen = services[0].seen  # type: ignore[misc]
        assert threshold == runtime.GC_THRESHOLDS and threshold[2] > 10
        assert frozen > 0 and not any(o is services[0].long_lived for o in gc.get_objects())
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
