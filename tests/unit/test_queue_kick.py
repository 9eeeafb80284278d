"""The queue's kicks of the placer are coalesced: a lone kick goes at once, a burst costs two."""

from __future__ import annotations

import asyncio

from tide_queue.service import Kicker


async def test_a_lone_kick_goes_at_once() -> None:
    sent: list[float] = []
    loop = asyncio.get_running_loop()

    async def send() -> None:
        sent.append(loop.time())

    kicker = Kicker(send, window_s=0.5)
    asked = loop.time()
    kicker.kick()
    await asyncio.sleep(0)  # one turn of the loop: no waiting for the window
    assert len(sent) == 1 and sent[0] - asked < 0.05
    await asyncio.sleep(0.6)
    assert len(sent) == 1  # nothing more was asked for: no trailing kick


async def test_a_burst_costs_one_kick_at_once_and_one_at_the_window_end() -> None:
    sent: list[float] = []
    loop = asyncio.get_running_loop()

    async def send() -> None:
        sent.append(loop.time())

    kicker = Kicker(send, window_s=0.1)
    start = loop.time()
    for _ in range(200):
        kicker.kick()
        await asyncio.sleep(0)
    await asyncio.sleep(0.25)
    assert len(sent) == 2, sent
    assert sent[0] - start < 0.05 and 0.09 <= sent[1] - start < 0.2  # the burst's last job is kicked too
    kicker.kick()  # after a quiet window: at once again
    await asyncio.sleep(0)
    assert len(sent) == 3 and kicker.sent == 3


async def test_a_failed_kick_does_not_stop_later_ones() -> None:
    calls = 0

    async def send() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("NATS away")

    kicker = Kicker(send, window_s=0.01)
    kicker.kick()
    await asyncio.sleep(0.05)
    kicker.kick()
    await asyncio.sleep(0.05)
    assert calls == 2 and kicker.sent == 1
    await kicker.close()
