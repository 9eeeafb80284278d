"""Calls made in one turn of the event loop, gathered into one batch call (one Redis round trip, one script)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """``await batcher(item)`` answers with ``run``'s result for that item; every call made before the event loop's
    next turn goes to one ``run(items)`` (its results in the items' order). The placer's concurrent steps (a
    cycle's gangs reserved or committed, a status batch's exits) and the queue's (a fetched batch's submissions)
    reach their Redis step in the same turn: one call for all of them instead of one each. An exception of ``run``
    is every caller's."""

    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]]) -> None:
        self.run = run
        self.batches = 0
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._waiting.append((item, future))
        if len(self._waiting) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self._waiting = self._waiting, []
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.batches += 1
        try:
            results = await self.run([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} answered {len(results)} results")
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every caller gets it, as if it had made the call alone
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
