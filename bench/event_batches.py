"""The NATS server's cost of storing job events three ways, side by side in one run on one server: one publish
each (a publish ack each), one fast-ingest batch (``tide.bus.nats.FastBatches``: what ``EventPublisher`` sends
from ``BATCH_MIN`` events on), and one atomic batch (ADR-50, staged on disk: what it sent before, from 16 on).

For each batch size it stores ``--events`` events (300-byte bodies, each with its ``Nats-Msg-Id``, to a file-backed
stream, as ``EventPublisher`` does) and reports the server's CPU per event (``/proc/<pid>/stat``), the wall time
per event, and the messages per event counted by the server (``/varz`` in_msgs + out_msgs). The ways take turns,
twice each, so a slow moment of the machine does not fall on one of them; the ratios are to one publish each.
Starts its own nats-server on a free port.

    .venv/bin/python bench/event_batches.py --json [--sizes 3,5,10,30] [--events 6000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig
from tide.bus.nats import FastBatches
from tide.stack.servers import free_port, nats_server_binary, wait_tcp

BODY = b"x" * 300
Publish = Callable[[list[tuple[str, bytes, dict[str, str]]]], Awaitable[None]]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_messages(monitor: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=5) as r:
        varz = json.load(r)
    return int(varz["in_msgs"]) + int(varz["out_msgs"])


def one_each(nc: NATS) -> Publish:
    js = nc.jetstream()

    async def publish(batch: list[tuple[str, bytes, dict[str, str]]]) -> None:
        await asyncio.gather(*[js.publish(subject, body, headers=headers) for subject, body, headers in batch])
    return publish


def fast(nc: NATS) -> Publish:
    return FastBatches(nc).publish


def atomic(nc: NATS) -> Publish:
    async def publish(batch: list[tuple[str, bytes, dict[str, str]]]) -> None:
        batch_id, last = uuid.uuid4().hex, len(batch)
        for seq, (subject, body, headers) in enumerate(batch, start=1):
            control = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(seq)}
            if seq < last:
                await nc.publish(subject, body, headers={**headers, **control})
            else:
                await nc.request(subject, body, timeout=5, headers={**headers, **control, "Nats-Batch-Commit": "1"})
    return publish


async def measure(size: int, events: int) -> dict:
    port, monitor = free_port(), free_port()
    with tempfile.TemporaryDirectory() as store:
        server = subprocess.Popen([nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor),
                                   "-sd", store], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_tcp("127.0.0.1", port)
            nc = await nats.connect(f"nats://127.0.0.1:{port}")
            await nc.jetstream().add_stream(StreamConfig(name="EVENTS", subjects=["ev.>"], allow_batched=True,
                                                         allow_atomic=True, duplicate_window=120))
            ways = {"one_each": one_each(nc), "fast_batch": fast(nc), "atomic_batch": atomic(nc)}
            totals = {name: [0.0, 0.0, 0] for name in ways}  # server CPU s, wall s, messages
            await ways["fast_batch"]([(f"ev.warm.{i}", BODY, {}) for i in range(3)])  # its subscription, once
            for turn in range(2):
                for name, publish in ways.items():
                    cpu0, wall0, msgs0 = cpu_seconds(server.pid), time.monotonic(), server_messages(monitor)
                    for b in range(events // 2 // size):
                        await publish([(f"ev.{name}.{turn}.{b}.{i}", BODY, {"Nats-Msg-Id": f"{name}.{turn}.{b}.{i}"})
                                       for i in range(size)])
                    totals[name][0] += cpu_seconds(server.pid) - cpu0
                    totals[name][1] += time.monotonic() - wall0
                    totals[name][2] += server_messages(monitor) - msgs0
            await nc.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
    n = events // 2 // size * size * 2
    per = {name: {"server_cpu_us_per_event": round(cpu * 1e6 / n, 1), "wall_us_per_event": round(wall * 1e6 / n, 1),
                  "messages_per_event": round(msgs / n, 2)} for name, (cpu, wall, msgs) in totals.items()}
    base = per["one_each"]
    for name in ("fast_batch", "atomic_batch"):
        per[name]["server_cpu_ratio_to_one_each"] = round(
            per[name]["server_cpu_us_per_event"] / max(base["server_cpu_us_per_event"], 1e-9), 2)
    return {"batch_size": size, "events": n, **per}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sizes", default="3,5,10,30")
    parser.add_argument("--events", type=int, default=6000)
    args = parser.parse_args()
    results = [await measure(int(s), args.events) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps({"benchmark": "event_batches", "machine": f"{os.cpu_count()} CPUs", "results": results},
                         indent=2))
    def line(r: dict) -> str:
        one, fast_, atom = r["one_each"], r["fast_batch"], r["atomic_batch"]
        return (f"{r['batch_size']}/batch: server CPU us/event one each {one['server_cpu_us_per_event']}, "
                f"fast {fast_['server_cpu_us_per_event']} (x{fast_['server_cpu_ratio_to_one_each']}), "
                f"atomic {atom['server_cpu_us_per_event']} (x{atom['server_cpu_ratio_to_one_each']}); msgs/event "
                f"{one['messages_per_event']}/{fast_['messages_per_event']}/{atom['messages_per_event']}")
    print("event_batches: " + "; ".join(line(r) for r in results))

if __name__ == "__main__":
    asyncio.run(main())
