"""Fixtures for the node agent: an agent on the simulated backend with its bus output captured, and a bare NATS."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tide.schemas.events import Message, PodExited, PodStarted, PodStatusBatch
from tide.schemas.node import NodeDescription, default_h100_node
from tide.settings import Settings
from tide.stack.servers import free_port, nats_server_binary, wait_tcp
from tide_node_agent.gpu.simulated import SimulatedBackend
from tide_node_agent.service import NodeAgent


class FakeNats:
    is_connected = True

    async def flush(self, timeout: float = 10) -> None:
        return None

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.headers: list[dict[str, str] | None] = []

    async def publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.published.append((subject, data))
        self.headers.append(headers)


class CapturedAgent(NodeAgent):
    """The real agent; only the bus is replaced by lists."""

    def __init__(self, settings: Settings, backend: SimulatedBackend) -> None:
        super().__init__(settings, backend)
        self.sent: list[Message] = []  # registrations as sent, and each pod transition when it happened
        self.batches: list[PodStatusBatch] = []  # the transitions as they went out (one batch per heartbeat)
        self.nc = FakeNats()  # type: ignore[assignment]

    async def _status(self, message: Message) -> None:
        if isinstance(message, PodStatusBatch):
            self.batches.append(message)
        else:
            self.sent.append(message)

    def _transition(self, message: PodStarted | PodExited) -> None:
        super()._transition(message)
        self.sent.append(message)

    async def exited(self, pod: str, timeout_s: float = 10.0) -> PodExited:
        for _ in range(int(timeout_s / 0.02)):
            for m in self.sent:
                if isinstance(m, PodExited) and m.pod == pod:
                    return m
            await asyncio.sleep(0.02)
        raise AssertionError(f"pod {pod} did not exit; sent: {self.sent}")


AgentFactory = Callable[..., CapturedAgent]


@pytest.fixture
def make_agent(tmp_path: Path) -> Iterator[AgentFactory]:
    agents: list[CapturedAgent] = []

    def make(node: NodeDescription | None = None, backend: SimulatedBackend | None = None,
             **settings: object) -> CapturedAgent:
        node = node or default_h100_node("n0")
        s = Settings(node_id=node.node_id, work_dir=tmp_path / "agent", **settings)
        agent = CapturedAgent(s, backend or SimulatedBackend(node, seed=1))
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        for pod in agent.pods.values():
            if pod.proc.returncode is None:
                try:
                    os.killpg(pod.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """A bare nats-server with JetStream, no auth."""
    port = free_port()
    proc = subprocess.Popen([nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port),
                             "-sd", str(tmp_path / "js")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_tcp("127.0.0.1", port)
    yield f"nats://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)
