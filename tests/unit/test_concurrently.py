"""tide.runtime.concurrently: awaitables run at once as with asyncio.gather, and a lone one in place, without a task
of its own (a consumer's batch of one message, a node's status batch of one job)."""

from __future__ import annotations

import asyncio

import pytest
from tide.runtime import concurrently


async def test_a_lone_awaitable_runs_in_the_caller_s_task() -> None:
    ran_in: list[asyncio.Task[object] | None] = []

    async def note() -> None:
        ran_in.append(asyncio.current_task())

    await concurrently([note()])
    assert ran_in == [asyncio.current_task()]


async def test_several_run_concurrently_and_the_first_error_propagates() -> None:
    a_started, b_started = asyncio.Event(), asyncio.Event()

    async def a() -> None:  # needs b running at the same time: run one after the other, this never ends
        a_started.set()
        await asyncio.wait_for(b_started.wait(), 1.0)

    async def b() -> None:
        b_started.set()
        await asyncio.wait_for(a_started.wait(), 1.0)

    await concurrently([a(), b()])

    async def fails() -> None:
        raise ValueError("bad message")

    with pytest.raises(ValueError, match="bad message"):
        await concurrently([fails()])
    with pytest.raises(ValueError, match="bad message"):
        await concurrently([a(), fails()])
    await concurrently([])
