"""``tide.bus.paced.PacedReading`` on a real NATS server: messages that come one by one are read in batches, at
most one read per interval, every one of them in order, also after the server restarts."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg
from tide.bus.paced import PacedReading
from tide.stack.servers import free_port, nats_server_binary, wait_tcp


class Server:
    """A bare nats-server on one port that can be stopped and started again there."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_tcp("127.0.0.1", self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(free_port())
    s.start()
    yield s
    s.stop()


async def trickle(url: str, subject: str, first: int, count: int, gap_s: float) -> None:
    """``count`` messages numbered from ``first``, one every ``gap_s``, each flushed on its own."""
    pub = await nats.connect(url)
    for i in range(first, first + count):
        await pub.publish(subject, str(i).encode())
        await pub.flush()
        await asyncio.sleep(gap_s)
    await pub.close()


async def until(done: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait until ``done()`` holds, for ``seconds`` at the most (the assertions after it say what was missing)."""
    for _ in range(int(seconds / 0.05)):
        if done():
            return
        await asyncio.sleep(0.05)


def bursts(times: list[float], within_s: float = 0.004) -> int:
    """How many runs of handling there were: messages handled less than ``within_s`` apart are one run."""
    return 1 + sum(1 for a, b in zip(times, times[1:], strict=False) if b - a > within_s)


async def receive(url: str, interval_s: float, count: int, gap_s: float) -> tuple[list[int], list[float], int]:
    nc = await nats.connect(url)
    reading = PacedReading(nc, interval_s)
    got: list[int] = []
    times: list[float] = []

    async def on_msg(msg: Msg) -> None:
        got.append(int(msg.data))
        times.append(time.monotonic())

    await nc.subscribe("beats.>", cb=reading.handler(on_msg))
    await nc.flush()
    await trickle(url, "beats.n1", 0, count, gap_s)
    await until(lambda: len(got) == count)
    reading.stop()
    await nc.close()
    return got, times, reading.pauses


async def test_messages_one_by_one_are_read_in_batches_all_of_them_in_order(server: Server) -> None:
    """40 messages 10 ms apart: read as they come, each is handled alone (about 40 runs); read every 150 ms,
    they are handled in a few runs, the ones of each interval together."""
    got, times, pauses = await receive(server.url, 0.0, 40, 0.01)
    assert got == list(range(40)) and pauses == 0
    as_they_come = bursts(times)
    got, times, pauses = await receive(server.url, 0.15, 40, 0.01)
    assert got == list(range(40))
    paced = bursts(times)
    assert 1 <= pauses <= 8 and paced <= pauses + 1, (pauses, paced)
    assert as_they_come >= 20 and paced * 3 <= as_they_come, (as_they_come, paced)


async def test_reading_stays_paced_across_a_server_restart(server: Server) -> None:
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    nc = await nats.connect(server.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1,
                            reconnected_cb=on_reconnect)
    reading = PacedReading(nc, 0.1)
    got: list[int] = []

    async def on_msg(msg: Msg) -> None:
        got.append(int(msg.data))

    await nc.subscribe("beats.>", cb=reading.handler(on_msg))
    await nc.flush()
    await trickle(server.url, "beats.n1", 0, 10, 0.01)
    await until(lambda: len(got) == 10)
    before = reading.pauses
    assert got == list(range(10)) and before >= 1
    server.stop()
    server.start()
    await asyncio.wait_for(reconnected.wait(), 10)  # with its subscription
    await nc.flush()
    await trickle(server.url, "beats.n1", 10, 20, 0.01)
    await until(lambda: len(got) == 30)
    reading.stop()
    await nc.close()
    assert got == list(range(30))
    assert reading.pauses > before  # the new connection's socket is paced too
