"""The node agent: registers its node, heartbeats with telemetry, runs pods on command."""

from __future__ import annotations

import asyncio

import structlog
from nats.aio.msg import Msg
from opentelemetry import trace
from tide import subjects
from tide.bus.nats import close_nats, connect, publish
from tide.runtime import every
from tide.schemas.events import (
    NODE_COMMAND,
    CommandAck,
    ExitReason,
    Message,
    NodeRegistered,
    PodExited,
    PodStarted,
    StartPod,
    StopPod,
    Telemetry,
)
from tide.schemas.node import NodeDescription, default_h100_node, load_node_file
from tide.settings import Settings
from tide.tracing import job_span

from tide_node_agent.gpu import BackendUnavailable, GpuBackend
from tide_node_agent.gpu.simulated import SimulatedBackend
from tide_node_agent.runtime import PodProcess, launch

log = structlog.get_logger()
tracer = trace.get_tracer("tide.node_agent")


def make_backend(settings: Settings) -> GpuBackend:
    if not settings.node_id:
        raise SystemExit("TIDE_NODE_ID is required")
    if settings.nvml_backend == "nvml":
        from tide_node_agent.gpu.nvml import NvmlBackend

        try:
            return NvmlBackend(settings.node_id)
        except BackendUnavailable as exc:
            raise SystemExit(f"node agent cannot start in NVML mode: {exc}") from exc
    if settings.nvml_backend != "simulated":
        raise SystemExit(f"unknown TIDE_NVML_BACKEND {settings.nvml_backend!r} (simulated or nvml)")
    return SimulatedBackend(describe_node(settings.node_id, settings))


def describe_node(node_id: str, settings: Settings) -> NodeDescription:
    if settings.node_file is None:
        return default_h100_node(node_id)
    for node in load_node_file(settings.node_file):
        if node.node_id == node_id:
            return node
    raise SystemExit(f"node {node_id!r} is not in {settings.node_file}")


class NodeAgent:
    def __init__(self, settings: Settings, backend: GpuBackend | None = None) -> None:
        self.settings = settings
        self.backend = backend or make_backend(settings)
        self.node = self.backend.discover()
        self.node_id = self.node.node_id
        self.pods: dict[str, PodProcess] = {}
        self._log = log.bind(node_id=self.node_id)

    async def start(self) -> None:
        self.nc = await connect(
            self.settings, f"tide-agent-{self.node_id}", inbox_prefix=subjects.node_inbox_prefix(self.node_id)
        )
        self.js = self.nc.jetstream()
        await self.nc.subscribe(subjects.node_cmd(self.node_id), cb=self._on_command)
        await self._status(NodeRegistered(node=self.node, running_pods=sorted(self.pods)))
        self.nc._reconnected_cb = self._on_reconnect  # re-announce after a NATS restart

    async def _on_reconnect(self) -> None:
        self._log.info("nats_reconnected_reregister")
        asyncio.get_running_loop().create_task(
            self._status(NodeRegistered(node=self.node, running_pods=sorted(self.pods)))
        )

    async def run(self, stop: asyncio.Event) -> None:
        await every(self.settings.heartbeat_s, stop, self._heartbeat)

    async def close(self) -> None:
        for pod in list(self.pods.values()):
            await pod.stop(grace_s=2.0)
        waiters = [p.waiter for p in self.pods.values() if p.waiter]
        if waiters:
            await asyncio.wait(waiters, timeout=5)
        await close_nats(self.nc)

    async def _status(self, message: Message) -> None:
        await publish(self.js, subjects.node_status(self.node_id), message)

    async def _heartbeat(self) -> None:
        busy: dict[int, float] = {}
        for pod in self.pods.values():
            for g in pod.cmd.gpus:
                busy[g.index] = busy.get(g.index, 0.0) + g.milli / 1000
        telemetry = Telemetry(node_id=self.node_id, running_pods=len(self.pods), gpus=self.backend.sample(busy))
        await self.nc.publish(subjects.telemetry(self.node_id), telemetry.to_bytes())

    # ------------------------------------------------------------ commands
    async def _on_command(self, msg: Msg) -> None:
        try:
            command = NODE_COMMAND.validate_json(msg.data)
            with job_span(tracer, f"agent.{command.kind}", command.job_id, node=self.node_id, pod=command.pod):
                if isinstance(command, StartPod):
                    ack = await self._start(command)
                else:
                    ack = await self._stop(command)
        except Exception as exc:
            self._log.exception("command_failed", error=repr(exc))
            ack = CommandAck(ok=False, error=repr(exc))
        if msg.reply:
            await msg.respond(ack.model_dump_json().encode())

    async def _start(self, cmd: StartPod) -> CommandAck:
        key = f"{cmd.job_id}/{cmd.pod}"
        if key in self.pods:
            return CommandAck(ok=True)
        known = {g.index for g in self.node.gpus}
        if any(g.index not in known for g in cmd.gpus):
            return CommandAck(ok=False, error=f"unknown GPU index in {[g.index for g in cmd.gpus]}")
        try:
            pod = await launch(cmd, self.settings.work_dir / self.node_id, self._on_exit)
        except OSError as exc:
            await self._status(PodExited(node_id=self.node_id, job_id=cmd.job_id, pod=cmd.pod, exit_code=None,
                                         reason=ExitReason.START_FAILED, message=str(exc)))
            return CommandAck(ok=True)
        self.pods[key] = pod
        self._log.info("pod_started", job_id=cmd.job_id, pod=cmd.pod, pid=pod.proc.pid,
                       gpus=[g.uuid for g in cmd.gpus])
        await self._status(PodStarted(node_id=self.node_id, job_id=cmd.job_id, pod=cmd.pod, pid=pod.proc.pid))
        return CommandAck(ok=True)

    async def _stop(self, cmd: StopPod) -> CommandAck:
        pod = self.pods.get(f"{cmd.job_id}/{cmd.pod}")
        if pod is None:
            # Not running here (finished already, or never started): say so, so the placer converges.
            await self._status(PodExited(node_id=self.node_id, job_id=cmd.job_id, pod=cmd.pod, exit_code=None,
                                         reason=ExitReason.STOPPED, message="not running on this node"))
            return CommandAck(ok=True)
        self._log.info("pod_stopping", job_id=cmd.job_id, pod=cmd.pod, grace_s=cmd.grace_s, reason=cmd.reason)
        asyncio.get_running_loop().create_task(pod.stop(cmd.grace_s))
        return CommandAck(ok=True)

    async def _on_exit(self, pod: PodProcess, rc: int, reason: ExitReason, sig: int | None, message: str) -> None:
        self.pods.pop(pod.key, None)
        self._log.info("pod_exited", job_id=pod.cmd.job_id, pod=pod.cmd.pod, exit_code=rc, reason=reason.value)
        await self._status(PodExited(node_id=self.node_id, job_id=pod.cmd.job_id, pod=pod.cmd.pod,
                                     exit_code=rc, signal=sig, reason=reason, message=message))
