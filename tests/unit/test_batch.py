"""The placer's ``Batcher``: the calls of one event-loop turn go out as one batch call, each caller gets its own
result (or the batch's exception), and a lone call is not held back."""

from __future__ import annotations

import asyncio

import pytest
from tide.batch import Batcher


async def test_calls_of_one_turn_are_one_batch_and_a_lone_call_goes_at_once() -> None:
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        batches.append(items)
        await asyncio.sleep(0)
        return [i * 10 for i in items]

    batch: Batcher[int, int] = Batcher(run)
    assert await asyncio.gather(*[batch(i) for i in range(5)]) == [0, 10, 20, 30, 40]
    assert batches == [[0, 1, 2, 3, 4]]
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await batch(7) == 70
    assert loop.time() - start < 0.05 and batches[-1] == [7] and batch.batches == 2


async def test_an_exception_is_every_callers() -> None:
    async def run(items: list[str]) -> list[str]:
        raise ConnectionError("Redis away")

    batch: Batcher[str, str] = Batcher(run)
    results = await asyncio.gather(batch("a"), batch("b"), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)

    async def short(items: list[str]) -> list[str]:
        return items[:1]

    wrong: Batcher[str, str] = Batcher(short)
    with pytest.raises(RuntimeError, match="answered 1"):
        await asyncio.gather(wrong("a"), wrong("b"))
