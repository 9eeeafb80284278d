"""A reserved gang whose background start fails outright is rolled back, not left holding its slots."""

from __future__ import annotations

from types import SimpleNamespace

from tide.settings import Settings
from tide_placer.service import PlacerService


async def test_a_start_that_raises_rolls_the_attempt_back() -> None:
    svc = PlacerService(Settings())
    rolled_back: list[tuple[str, int, str]] = []

    async def start(reserved: object) -> None:
        raise ConnectionError("redis went away")

    async def rollback(job_id: str, attempt: int, why: str, bad_nodes: list[str] | None = None) -> None:
        rolled_back.append((job_id, attempt, why))

    svc._start, svc._rollback = start, rollback  # type: ignore[method-assign]
    reserved = SimpleNamespace(record=SimpleNamespace(job_id="j1"), resv="j1:3", attempt=3)
    await svc._start_or_roll_back(reserved)  # type: ignore[arg-type]
    assert rolled_back == [("j1", 3, "start failed: ConnectionError('redis went away')")]


async def test_a_rollback_that_also_fails_is_left_to_the_lapse_sweep() -> None:
    svc = PlacerService(Settings())

    async def fail(*args: object, **kwargs: object) -> None:
        raise ConnectionError("still away")

    svc._start, svc._rollback = fail, fail  # type: ignore[method-assign]
    reserved = SimpleNamespace(record=SimpleNamespace(job_id="j1"), resv="j1:1", attempt=1)
    await svc._start_or_roll_back(reserved)  # type: ignore[arg-type]  # must not raise into the event loop
