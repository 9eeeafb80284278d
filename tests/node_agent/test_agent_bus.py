"""A real agent process on a real NATS: registration, regular heartbeats, commands, and being killed -9.

What the placer does with a silent node (lost -> requeue its jobs) is the placer's test; here: the agent's side.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
from tide import subjects
from tide.bus.nats import ensure_streams
from tide.schemas.events import (
    NODE_STATUS,
    CommandAck,
    ExitReason,
    NodeRegistered,
    PodExited,
    PodStarted,
    StartPod,
    Telemetry,
)

from tests.helpers import py

NODE = "bus-node"


def spawn_agent(nats_url: str, work: Path) -> subprocess.Popen:
    env = {**os.environ, "TIDE_NATS_URL": nats_url, "TIDE_NODE_ID": NODE, "TIDE_WORK_DIR": str(work),
           "TIDE_HEARTBEAT_S": "0.2", "TIDE_TELEMETRY_S": "0.4", "TIDE_LOG_FORMAT": "json"}
    return subprocess.Popen([sys.executable, "-m", "tide_node_agent"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


async def next_of(queue: asyncio.Queue, kind: type | tuple[type, ...], timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while True:
        item = await asyncio.wait_for(queue.get(), max(0.01, deadline - time.monotonic()))
        if isinstance(item, kind):
            return item


async def test_agent_heartbeats_runs_pods_and_dies_with_them(nats_url: str, tmp_path: Path) -> None:
    nc = await nats.connect(nats_url)
    await ensure_streams(nc.jetstream())
    status: asyncio.Queue = asyncio.Queue()
    beats: list[tuple[float, Telemetry]] = []
    subject_of: dict[int, str] = {}  # a beat's seq -> the subject it came on

    async def on_status(msg) -> None:
        message = NODE_STATUS.validate_json(msg.data)
        for item in getattr(message, "items", None) or [message]:  # pod transitions come batched per heartbeat
            await status.put(item)

    listed: dict[int, tuple[set[str], float]] = {}  # a beat's seq -> its pods header and when it was taken

    async def on_beat(msg) -> None:
        beat = Telemetry.model_validate_json(msg.data)
        beats.append((time.monotonic(), beat))
        subject_of[beat.seq] = msg.subject
        listed[beat.seq] = ({p for p in msg.headers[subjects.PODS_HEADER].split(",") if p},
                            float(msg.headers[subjects.PODS_AT_HEADER]))

    await nc.subscribe(subjects.node_status(NODE), cb=on_status)
    await nc.subscribe(subjects.telemetry(NODE), cb=on_beat)
    await nc.subscribe(subjects.heartbeat(NODE), cb=on_beat)
    agent = spawn_agent(nats_url, tmp_path / "work")
    survivor = None
    try:
        reg = await next_of(status, NodeRegistered)
        assert reg.node.node_id == NODE and len(reg.node.gpus) == 8 and reg.running_pods == []
        assert reg.node.labels["tide.gpu.model"] == "H100-80GB" and reg.node.gpus[0].topology[1] == "nvlink"

        async def request(cmd: StartPod) -> CommandAck:
            reply = await nc.request(subjects.node_cmd(NODE), cmd.to_bytes(), timeout=5)
            return CommandAck.model_validate_json(reply.data)

        ok = StartPod(job_id="quick", pod="quick-0", pod_index=0, world_size=1, command=py("print('hi')"))
        assert (await request(ok)).started
        # the answer told of the start: its PodStarted goes out only beside the exit, when both fall in one
        # heartbeat (a slow box may end the pod a heartbeat later), and then before it
        quick = [await next_of(status, (PodStarted, PodExited))]
        while not isinstance(quick[-1], PodExited):
            quick.append(await next_of(status, (PodStarted, PodExited)))
        assert [m.pod for m in quick] in (["quick-0"], ["quick-0", "quick-0"]), quick
        assert isinstance(quick[0], PodStarted) or len(quick) == 1
        assert quick[-1].reason == ExitReason.COMPLETED

        pidfile = tmp_path / "pod.pid"
        long = StartPod(job_id="long", pod="long-0", pod_index=0, world_size=1,
                        command=py(f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
                                   "time.sleep(300)"))
        assert (await request(long)).started
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                break
            await asyncio.sleep(0.02)
        pod_pid = int(pidfile.read_text())

        await asyncio.sleep(1.0)
        reported = [status.get_nowait() for _ in range(status.qsize())]
        assert not [m for m in reported if isinstance(m, PodStarted)], "the answer said it started: not repeated"
        seqs = [t.seq for _, t in beats]
        assert seqs == sorted(seqs) and len(seqs) >= 4, seqs
        gaps = [b - a for (a, _), (b, _) in zip(beats, beats[1:], strict=False)]
        assert max(gaps) < 1.0, f"heartbeats must be regular: {gaps}"
        assert all(t.heartbeat_s == 0.2 for _, t in beats)
        with_gpus = [t for _, t in beats if t.gpus]
        assert with_gpus and len(with_gpus) < len(beats), "GPU samples ride on some heartbeats only"
        # one message per beat: the beats with samples on the telemetry subject, the others on the heartbeat one
        assert sorted(subject_of) == seqs
        assert {subject_of[t.seq] for t in with_gpus} == {subjects.telemetry(NODE)}
        assert {subject_of[t.seq] for _, t in beats if not t.gpus} == {subjects.heartbeat(NODE)}
        assert any(t.running_pods == 1 and t.pods and t.pods[0].job_id == "long" for t in with_gpus)
        # each beat says when its pods list was taken (as it was sent); a list taken after a pod's reported exit
        # never lists it, so the placer may judge a list read late by the exits reported after it
        assert all(abs(listed[t.seq][1] - t.ts) < 0.5 for _, t in beats)
        assert all(at < quick[-1].ts for pods, at in listed.values() if "quick/quick-0" in pods)
        assert any("long/long-0" in pods for pods, _ in listed.values())

        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=5)
        killed_at = time.monotonic()
        await asyncio.sleep(1.0)
        assert all(at <= killed_at + 0.05 for at, _ in beats), "a dead agent sends no heartbeats"
        for _ in range(100):  # the pod dies with its agent (PR_SET_PDEATHSIG)
            try:
                os.kill(pod_pid, 0)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the pod outlived its killed agent")

        # a restarted agent re-registers without the pod; the placer marks that pod lost
        survivor = spawn_agent(nats_url, tmp_path / "work")
        again = await next_of(status, NodeRegistered)
        assert again.running_pods == []
    finally:
        for p in (agent, survivor):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
        await nc.close()
