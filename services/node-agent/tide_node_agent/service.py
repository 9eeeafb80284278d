"""The node agent: registers its node, heartbeats with telemetry, runs pods on command.

- Inventory: ``backend.discover()`` plus labels, published as ``NodeRegistered`` at start, after a
  NATS reconnect, and whenever a re-discovery (every ``TIDE_INVENTORY_S``) finds a change.
- Heartbeat: a ``Telemetry`` message every ``TIDE_HEARTBEAT_S`` with a sequence number, on
  ``tide.heartbeat.<id>``; every ``TIDE_TELEMETRY_S`` the beat also carries the GPU samples and per-pod usage and
  goes on ``tide.telemetry.<id>`` instead (the subject the TELEMETRY stream keeps and metrics reads).
- Pods: ``StartPod`` -> resolve MIG instances (creating them if needed), pick CPUs, MPS, runtime
  argv/env, launch; ``PodExited`` with reason, signal, peak GPU memory once it ends. A placer cycle's
  starts for this node come in one ``StartPods`` request (each start keeps its token and expiry); the
  pods' transitions (``PodStarted``, ``PodExited``) go out together in one ``PodStatusBatch`` per
  heartbeat (registrations at once, after the transitions before them). A ``PodStarted`` whose start was
  answered ``started`` is left out while its pod runs: the answer told the placer already, and a placer
  that missed it asks (``SettlePod``). It goes with its pod's exit when both fall in one heartbeat, so the
  placer still sees the start before the exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import structlog
from nats.aio.msg import Msg
from opentelemetry import trace
from tide import subjects
from tide.bus.nats import close_nats, connect, publish
from tide.core.lifecycle import gpus_overcommitted, pod_fate, start_refusal, transition_key, transitions_to_report
from tide.core.mig import profiles_for
from tide.runtime import every
from tide.schemas.events import (
    NODE_COMMAND,
    CommandAck,
    ExitReason,
    GpuAssignment,
    GpuSample,
    Message,
    NodeRegistered,
    PodExited,
    PodFate,
    PodStarted,
    PodStatusBatch,
    PodUsage,
    SettlePod,
    StartPod,
    StartPods,
    StopPod,
    Telemetry,
    parse_agent_pod_id,
)
from tide.schemas.node import MigInstanceDescription, NodeDescription, default_h100_node, load_node_file
from tide.settings import Settings
from tide.tracing import job_span, remote_parent, stored_parent

from tide_node_agent import logs
from tide_node_agent.gpu import BackendUnavailable, GpuBackend, MigError, PodGpus, parse_labels, with_labels
from tide_node_agent.gpu.simulated import SimulatedBackend
from tide_node_agent.runtime import (
    AT_LIMIT_RATIO,
    MpsControl,
    PodProcess,
    forget_pod,
    launch,
    make_runtime,
    pod_environment,
    reap_orphans,
    record_pod,
)

log = structlog.get_logger()
tracer = trace.get_tracer("tide.node_agent")
MIB = 1024 * 1024
FENCE_MEMORY = 10_000
"""jobs whose fencing floor the agent remembers (oldest forgotten first)"""
STOPPING_HOLDER_WAIT_S = 2.0
"""how long a start waits for a stopping pod on its GPUs to exit before it kills that pod outright"""
RECENT_EXITS = 256  # exits a (re-)registration repeats, so a pod whose exit is still on its way is not called lost


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


@dataclass
class PodMig:
    """MIG changes made for one pod, undone when it ends."""

    created: list[tuple[int, str]] = field(default_factory=list)
    destroyed: list[tuple[int, str, int]] = field(default_factory=list)
    enabled: list[int] = field(default_factory=list)


@dataclass
class PodState:
    gpus: PodGpus
    mig: PodMig
    started: float = field(default_factory=time.monotonic)
    memory_bytes: int = 0
    peak_bytes: int = 0
    pcie_bytes: float = 0.0
    nvlink_bytes: float = 0.0


class NodeAgent:
    def __init__(self, settings: Settings, backend: GpuBackend | None = None) -> None:
        self.settings = settings
        self.backend = backend or make_backend(settings)
        self.simulated = isinstance(self.backend, SimulatedBackend)
        self.extra_labels = parse_labels(settings.node_labels)
        self.runtime = make_runtime(settings.runtime, settings.runtime_command, settings.runtime_image)
        self.pods: dict[str, PodProcess] = {}
        self.state: dict[str, PodState] = {}
        # fencing: job -> the lowest attempt that may still start here (an attempt seen started, or one
        # past an attempt told to stop); a start request with an older token is refused
        self.floor: OrderedDict[str, int] = OrderedDict()
        self.node = self.inventory()
        self.node_id = self.node.node_id
        self.work_dir = settings.work_dir / self.node_id
        self.mps = MpsControl(settings.mps_dir or self.work_dir / "mps", launch=not self.simulated)
        self.pids_dir = self.work_dir / "pids"
        self.lease_file = self.work_dir / "lease"  # the lease's deadline, read by the pod leaders (pod_leader.py)
        self.recent_exits: dict[str, PodExited] = {}  # pod key -> its exit, the last RECENT_EXITS, for re-registration
        self.seq = 0
        self._last_telemetry = 0.0
        self._last_inventory = time.monotonic()
        self._last_beat = time.monotonic()
        self._last_contact = time.monotonic()  # the last time NATS answered (the node lease's renewal)
        self._fenced = False  # the lease ran out and the pods were stopped; cleared by the next contact
        self._log = log.bind(node_id=self.node_id)
        self._transitions: list[PodStarted | PodExited] = []  # not sent yet: they go with the next heartbeat
        self._answered: set[str] = set()  # pods (keys) of pending PodStarted whose 'started' answer went out
        self._flush_lock = asyncio.Lock()
        self._flushes: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ inventory
    def inventory(self) -> NodeDescription:
        """What the placer should plan with: the node as discovered, minus the MIG changes Tide made for
        running pods (their claims already account for them), plus labels."""
        node = self.backend.discover()
        created = {uuid for s in self.state.values() for _, uuid in s.mig.created}
        destroyed = [d for s in self.state.values() for d in s.mig.destroyed]
        enabled = {i for s in self.state.values() for i in s.mig.enabled}
        for g in node.gpus:
            g.mig_instances = [m for m in g.mig_instances if m.uuid not in created]
            g.mig_instances += [MigInstanceDescription(profile=p, start=st) for i, p, st in destroyed if i == g.index]
            g.mig_instances.sort(key=lambda m: m.start)
            if g.index in enabled and not g.mig_instances:
                g.mig_enabled = False
        return with_labels(node, self.extra_labels)

    async def _check_inventory(self) -> None:
        node = self.inventory()
        if node != self.node:
            self._log.info("inventory_changed")
            self.node = node
            await self._register()

    async def _register(self) -> None:
        await self._flush_transitions()  # the transitions before it go first
        await self._status(NodeRegistered(node=self.node, running_pods=sorted(self.pods),
                                          exited=list(self.recent_exits.values()),
                                          lease_s=self.settings.node_lease_s,
                                          fence_grace_s=self.settings.fence_grace_s,
                                          heartbeat_s=self.settings.heartbeat_s))

    # ------------------------------------------------------------ service
    async def start(self) -> None:
        self._write_lease(time.monotonic() + self.settings.node_lease_s)
        reaped = reap_orphans(self.pids_dir)
        if reaped:  # a previous agent died with pods running: they are not ours any more (the placer calls them lost)
            self._log.warning("orphan_pods_killed", pods=reaped)
        self.nc = await connect(
            self.settings, f"tide-agent-{self.node_id}", inbox_prefix=subjects.node_inbox_prefix(self.node_id)
        )
        self.js = self.nc.jetstream()
        await self.nc.subscribe(subjects.node_cmd(self.node_id), cb=self._on_command)
        await self.nc.subscribe(subjects.node_logs(self.node_id), cb=self._on_logs)
        await self._register()
        self.nc._reconnected_cb = self._on_reconnect  # re-announce after a NATS restart

    async def _on_reconnect(self) -> None:
        self._log.info("nats_reconnected_reregister")
        asyncio.get_running_loop().create_task(self._register())

    async def run(self, stop: asyncio.Event) -> None:
        await every(self.settings.heartbeat_s, stop, self._heartbeat)

    async def close(self) -> None:
        for pod in list(self.pods.values()):
            await pod.stop(grace_s=2.0)
        waiters = [p.waiter for p in self.pods.values() if p.waiter]
        if waiters:
            await asyncio.wait(waiters, timeout=5)
        await self.mps.stop()
        try:
            await asyncio.wait_for(self._flush_transitions(), timeout=5)
        except Exception as exc:  # noqa: BLE001 - NATS away: the placer settles them (registration, SettlePod)
            self._log.warning("transitions_not_sent", pods=len(self._transitions), error=repr(exc))
        await close_nats(self.nc)
        self.backend.close()

    async def _status(self, message: Message) -> None:
        await publish(self.js, subjects.node_status(self.node_id), message)

    def _transition(self, message: PodStarted | PodExited) -> None:
        """A pod started or exited: reported with the next heartbeat, with the node's other transitions."""
        self._transitions.append(message)

    async def _flush_transitions(self) -> None:
        """Publish the pending transitions as one ``PodStatusBatch`` (one batch at a time, in order); if that
        fails they are kept, first, for the next try."""
        async with self._flush_lock:
            if not self._transitions:
                return
            items, self._transitions = self._transitions, []
            report = transitions_to_report(items, self._answered)
            try:
                if report:
                    await self._status(PodStatusBatch(node_id=self.node_id, items=report))
            except BaseException:
                self._transitions[:0] = items
                raise
            self._answered.difference_update(transition_key(i) for i in items if isinstance(i, PodStarted))

    async def _flush_in_background(self) -> None:
        """The heartbeat's flush: never holds the heartbeat (and the lease renewal) while NATS is away."""
        if self._flush_lock.locked() or not self._transitions:
            return

        async def flush() -> None:
            try:
                await self._flush_transitions()
            except Exception as exc:  # noqa: BLE001 - kept for the next heartbeat
                self._log.warning("transitions_not_sent", pods=len(self._transitions), error=repr(exc))

        task = asyncio.get_running_loop().create_task(flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    # ------------------------------------------------------------ heartbeat and telemetry
    def busy(self) -> dict[int, float]:
        busy: dict[int, float] = {}
        for s in self.state.values():
            for i in s.gpus.gpus:
                busy[i] = busy.get(i, 0.0) + s.gpus.share
        return busy

    def poll_memory(self) -> None:
        """Per-pod GPU memory now (its processes: the pid and anything in its process group) and peaks."""
        per_pid = self.backend.process_memory()
        totals: dict[str, int] = {}
        leaders = {pod.proc.pid: key for key, pod in self.pods.items()}
        for pid, used in per_pid.items():
            key = leaders.get(pid)
            if key is None:
                try:
                    key = leaders.get(os.getpgid(pid))
                except (ProcessLookupError, PermissionError):
                    key = None
            if key is not None:
                totals[key] = totals.get(key, 0) + used
        for key, s in self.state.items():
            s.memory_bytes = totals.get(key, 0)
            s.peak_bytes = max(s.peak_bytes, s.memory_bytes)

    def telemetry(self, now: float | None = None) -> tuple[list[GpuSample], list[PodUsage]]:
        """GPU samples now, and each pod's usage with the interconnect bytes since the last sample."""
        now = time.monotonic() if now is None else now
        samples = self.backend.sample(self.busy())
        by_index = {s.index: s for s in samples}
        dt = now - self._last_telemetry if self._last_telemetry else 0.0
        usage = []
        for key, s in self.state.items():
            span = min(dt, now - s.started)
            for i in s.gpus.gpus:
                g = by_index.get(i)
                if g is not None and span > 0:
                    s.pcie_bytes += (g.pcie_tx_bytes_per_s + g.pcie_rx_bytes_per_s) * s.gpus.share * span
                    s.nvlink_bytes += (g.nvlink_tx_bytes_per_s + g.nvlink_rx_bytes_per_s) * s.gpus.share * span
            job_id, pod = key.split("/", 1)
            proc = self.pods.get(key)
            usage.append(PodUsage(job_id=job_id, pod=pod, gpu_memory_bytes=s.memory_bytes,
                                  peak_memory_bytes=s.peak_bytes, pcie_bytes=s.pcie_bytes,
                                  nvlink_bytes=s.nvlink_bytes,
                                  network_bytes=network_bytes(proc.proc.pid) if proc else None))
        self._last_telemetry = now
        for sample in samples:
            if sample.xid_errors:
                self._log.warning("gpu_xid", gpu=sample.index, xids=sample.xid_errors)
        return samples, usage

    # ------------------------------------------------------------ node lease (self-fencing)
    def lease_expired(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return now - self._last_contact > self.settings.node_lease_s

    def _write_lease(self, deadline: float) -> None:
        """Publish the lease's deadline to the pod leaders, which fence their pods when it passes even if
        this process is frozen and cannot (atomically: a leader never reads half a number)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.lease_file.with_suffix(".tmp")
        tmp.write_text(f"{deadline:.3f}\n")
        os.replace(tmp, self.lease_file)

    def _check_lease(self, now: float | None = None) -> None:
        """Unreached for the lease time: the placer will reschedule these pods elsewhere, so stop them
        (SIGTERM, ``TIDE_FENCE_GRACE_S``, SIGKILL) before it does. Their exits go out once NATS is back."""
        if not self.lease_expired(now) or self._fenced:
            return
        self._fenced = True
        if self.pods:
            self._log.warning("self_fencing", pods=sorted(self.pods),
                              unreached_s=round(time.monotonic() - self._last_contact, 1))
        for pod in list(self.pods.values()):
            pod.fenced = True
            asyncio.get_running_loop().create_task(pod.stop(self.settings.fence_grace_s))

    async def _renew(self) -> None:
        """The lease is renewed by a round trip to NATS (a PING answered by the server), dated when the
        PING was sent: never later than the heartbeat published just before it, so the agent's lease
        runs out no later than the placer's count from that heartbeat (docs/architecture.md)."""
        if not self.nc.is_connected:
            return
        sent = time.monotonic()
        try:
            await self.nc.flush(timeout=max(1, int(self.settings.heartbeat_s)))
        except Exception:  # noqa: BLE001 - unreachable: the lease runs down
            return
        self._last_contact = sent
        self._write_lease(sent + self.settings.node_lease_s)
        self._fenced = False

    async def _heartbeat(self) -> None:
        now = time.monotonic()
        self._check_lease(now)  # first: after a stall the last contact is old, whatever happens next
        self.seq += 1
        self._last_beat = now
        self.poll_memory()
        gpus: list[GpuSample] = []
        pods: list[PodUsage] = []
        sampled = now - self._last_telemetry >= self.settings.telemetry_s - 1e-3 or not self._last_telemetry
        if sampled:
            gpus, pods = self.telemetry(now)
        telemetry = Telemetry(node_id=self.node_id, running_pods=len(self.pods), gpus=gpus, pods=pods,
                              seq=self.seq, heartbeat_s=self.settings.heartbeat_s)
        # one message per beat: with the samples on the telemetry subject (kept, read by metrics), else on the
        # heartbeat subject (the placer's liveness only)
        subject = subjects.telemetry(self.node_id) if sampled else subjects.heartbeat(self.node_id)
        await self.nc.publish(subject, telemetry.to_bytes(),
                              headers={subjects.PODS_HEADER: ",".join(sorted(self.pods)),
                                       subjects.PODS_AT_HEADER: repr(time.time())})
        await self._renew()
        await self._flush_in_background()
        if now - self._last_inventory >= self.settings.inventory_s:
            self._last_inventory = now
            await self._check_inventory()

    # ------------------------------------------------------------ commands
    async def _on_command(self, msg: Msg) -> None:
        command: StartPod | StartPods | SettlePod | StopPod | None = None
        try:
            command = NODE_COMMAND.validate_json(msg.data)
            self._check_lease()
            with remote_parent(msg.headers), job_span(tracer, f"agent.{command.kind}", command.job_id,
                                                      node=self.node_id, pod=command.pod):  # the placer's trace
                if isinstance(command, StartPods):
                    ack = CommandAck(ok=True, acks=[await self._start_one(s) for s in command.starts])
                elif isinstance(command, StartPod):
                    ack = await self._start(command)
                elif isinstance(command, SettlePod):
                    ack = self._settle(command)
                else:
                    ack = await self._stop(command)
        except Exception as exc:
            self._log.exception("command_failed", error=repr(exc))
            ack = CommandAck(ok=False, error=repr(exc))
        if msg.reply:
            await msg.respond(ack.model_dump_json().encode())
            self._note_answered(command, ack)

    def _note_answered(self, command: StartPod | StartPods | SettlePod | StopPod | None, ack: CommandAck) -> None:
        """The placer was told these pods started (the answer went out): their pending ``PodStarted`` may stay
        home (``transitions_to_report``)."""
        if isinstance(command, StartPods):
            told = {f"{s.job_id}/{s.pod}" for s, a in zip(command.starts, ack.acks, strict=False) if a.started}
        elif isinstance(command, StartPod) and ack.started:
            told = {f"{command.job_id}/{command.pod}"}
        else:
            return
        pending = {transition_key(t) for t in self._transitions if isinstance(t, PodStarted)}
        self._answered.update(told & pending)

    async def _on_logs(self, msg: Msg) -> None:
        """Pod logs on request (tide_node_agent/logs.py), read in a thread: a slow disk never stalls commands."""
        if not msg.reply:
            return
        body = await asyncio.to_thread(logs.answer, self.work_dir, self.node_id, set(self.pods), msg.data)
        await msg.respond(json.dumps(body).encode())

    def _cpus_for(self, cmd: StartPod) -> list[int] | None:
        if not self.settings.cpu_pinning or not cmd.gpus:
            return None
        wanted = {c for g in cmd.gpus for c in self.node.gpus[g.index].cpu_affinity}
        usable = sorted(wanted & os.sched_getaffinity(0))
        if wanted and not usable:
            self._log.info("cpu_pinning_skipped", job_id=cmd.job_id, reason="GPU-local CPUs not available here")
        return usable or None

    def _limit_and_share(self, cmd: StartPod) -> tuple[int, float]:
        limit, share = 0, 1.0
        for g in cmd.gpus:
            gpu = self.node.gpus[g.index]
            if g.mig_profile:
                p = profiles_for(gpu.model)[g.mig_profile]
                limit += p.memory_mib * MIB
                share = p.compute / 7
            elif g.milli < 1000 or cmd.share_memory_mib is not None:
                limit += (g.memory_mib or cmd.share_memory_mib or gpu.memory_mib) * MIB
                share = g.milli / 1000 if g.milli else 1.0
            else:
                limit += gpu.memory_mib * MIB
        return limit, share

    def _raise_floor(self, job_id: str, attempt: int) -> None:
        self.floor[job_id] = max(self.floor.get(job_id, 0), attempt)
        self.floor.move_to_end(job_id)
        while len(self.floor) > FENCE_MEMORY:
            self.floor.popitem(last=False)

    async def _start_one(self, cmd: StartPod) -> CommandAck:
        """One start of a ``StartPods``: an error is that start's refusal, not the others'. Its span continues its own
        job's trace (``StartPod.traceparent``; the batch's header names only one job's)."""
        try:
            with stored_parent(cmd.traceparent), job_span(tracer, "agent.start", cmd.job_id, node=self.node_id,
                                                          pod=cmd.pod):
                return await self._start(cmd)
        except Exception as exc:
            self._log.exception("command_failed", job_id=cmd.job_id, pod=cmd.pod, error=repr(exc))
            return CommandAck(ok=False, error=repr(exc))

    async def _start(self, cmd: StartPod) -> CommandAck:
        key = f"{cmd.job_id}/{cmd.pod}"
        if key in self.pods:
            return CommandAck(ok=True, started=True)
        if self._fenced:
            return CommandAck(ok=False, error="node lease expired: the agent fenced itself (no pods until "
                                               "it reaches NATS again)")
        _, attempt = parse_agent_pod_id(cmd.pod)
        refusal = start_refusal(attempt, self.floor.get(cmd.job_id, 0), cmd.expires_at, time.time())
        if refusal:
            self._log.warning("start_refused", job_id=cmd.job_id, pod=cmd.pod, reason=refusal)
            return CommandAck(ok=False, error=refusal)
        self._raise_floor(cmd.job_id, attempt)
        # a newer token: whatever older attempt of the job (older than its oldest live one: elastic extras
        # start with a newer token beside the gang's), or of this pod, runs here is stale
        job_floor = attempt if cmd.job_floor is None else min(cmd.job_floor, attempt)
        name = parse_agent_pod_id(cmd.pod)[0]
        for old in list(self.pods.values()):
            old_name, old_attempt = parse_agent_pod_id(old.cmd.pod)
            stale = old_attempt < job_floor or (old_name == name and old_attempt < attempt)
            if old.cmd.job_id == cmd.job_id and stale:
                self._log.warning("stale_pod_stopping", job_id=cmd.job_id, pod=old.cmd.pod, newer=cmd.pod)
                old.stopping = True  # now, not when the task runs: a start behind this one waits for it
                asyncio.get_running_loop().create_task(old.stop(0.0))
        known = {g.index for g in self.node.gpus}
        if any(g.index not in known for g in cmd.gpus):
            return CommandAck(ok=False, error=f"unknown GPU index in {[g.index for g in cmd.gpus]}")
        held = await self._gpus_held(cmd)
        if held:
            self._log.warning("start_refused", job_id=cmd.job_id, pod=cmd.pod, reason="gpus_held", held=held)
            return CommandAck(ok=False, error=f"GPUs still held by running pods: {held}")
        try:
            uuids, mig = self.resolve_gpus(cmd)
        except MigError as exc:
            self._log.warning("mig_refused", job_id=cmd.job_id, pod=cmd.pod, error=str(exc))
            return CommandAck(ok=False, error=f"MIG: {exc}")
        limit, share = self._limit_and_share(cmd)
        pod_dir = self.work_dir / cmd.job_id
        memory_file = str(pod_dir / f"{cmd.pod}.gpumem") if self.simulated else None
        try:
            shares = cmd.share_sm_percent is not None or cmd.share_memory_mib is not None
            if shares:
                await self.mps.ensure()
            env = pod_environment(cmd, dict(os.environ), uuids, self.mps.dirs if shares else None)
            if memory_file:
                env["TIDE_SIM_GPU_MEMORY_FILE"] = memory_file
            spec = self.runtime.prepare(cmd, env, self._cpus_for(cmd))
        except (ValueError, RuntimeError) as exc:
            self.release_mig(mig)
            return CommandAck(ok=False, error=str(exc))
        try:
            pod = await launch(cmd, self.work_dir, self._on_exit, spec=spec, at_limit=self._at_limit,
                               lease_file=self.lease_file, fence_grace_s=self.settings.fence_grace_s)
        except OSError as exc:
            self.release_mig(mig)
            self._transition(PodExited(node_id=self.node_id, job_id=cmd.job_id, pod=cmd.pod, exit_code=None,
                                       reason=ExitReason.START_FAILED, message=str(exc)))
            return CommandAck(ok=True)
        self.pods[key] = pod
        record_pod(self.pids_dir, key, pod.proc.pid)
        mig_uuid = next((u for g, u in zip(cmd.gpus, uuids, strict=True) if g.mig_profile), None)
        gpus = PodGpus(key=key, pid=pod.proc.pid, gpus=tuple(g.index for g in cmd.gpus), share=share,
                       memory_limit_bytes=limit, mig_uuid=mig_uuid, memory_file=memory_file)
        self.state[key] = PodState(gpus=gpus, mig=mig)
        self.backend.pod_started(gpus)
        self._log.info("pod_started", job_id=cmd.job_id, pod=cmd.pod, pid=pod.proc.pid, gpus=uuids,
                       runtime=self.runtime.name, cpus=len(spec.cpus or []))
        self._transition(PodStarted(node_id=self.node_id, job_id=cmd.job_id, pod=cmd.pod, pid=pod.proc.pid))
        return CommandAck(ok=True, started=True)

    async def _gpus_held(self, cmd: StartPod) -> dict[str, list[int]]:
        """Make room on the GPUs the start wants; what is still held by a pod that is not stopping.

        A stopping pod may hold them still: the placer releases a rolled-back pod's claims once its stop is
        acknowledged, before the process has died. The start waits for such a pod to exit (it is killed
        outright after ``STOPPING_HOLDER_WAIT_S``: its GPUs belong to the new pod now), so no GPU ever has
        two holders. A live pod there means Redis and the node disagree: the start is refused."""
        clashes = gpus_overcommitted(cmd.gpus, {k: p.cmd.gpus for k, p in self.pods.items()})
        stopping = [self.pods[k] for k in clashes if self.pods[k].stopping or self.pods[k].proc.returncode is not None]
        for pod in stopping:
            self._log.info("start_waits_for_stopping_pod", job_id=cmd.job_id, pod=cmd.pod, holder=pod.key)
            if pod.waiter is None:
                continue
            try:
                await asyncio.wait_for(asyncio.shield(pod.waiter), STOPPING_HOLDER_WAIT_S)
            except TimeoutError:
                pod.kill()
                await asyncio.wait_for(asyncio.shield(pod.waiter), STOPPING_HOLDER_WAIT_S)
        return gpus_overcommitted(cmd.gpus, {k: p.cmd.gpus for k, p in self.pods.items()})

    def _settle(self, cmd: SettlePod) -> CommandAck:
        """What became of a pod whose start the placer saw unanswered; a pod never started here is refused
        from now on (the floor passes its attempt), so the placer may roll its attempt back."""
        key = f"{cmd.job_id}/{cmd.pod}"
        fate = pod_fate(key, self.pods, self.recent_exits)
        if fate == PodFate.ABSENT:
            self._raise_floor(cmd.job_id, parse_agent_pod_id(cmd.pod)[1] + 1)
        self._log.info("pod_settled", job_id=cmd.job_id, pod=cmd.pod, fate=fate.value)
        return CommandAck(ok=True, fate=fate, exited=self.recent_exits.get(key))

    async def _stop(self, cmd: StopPod) -> CommandAck:
        # the attempt is over on this node: a start of it that arrives late (after a stall) is refused
        self._raise_floor(cmd.job_id, parse_agent_pod_id(cmd.pod)[1] + 1)
        pod = self.pods.get(f"{cmd.job_id}/{cmd.pod}")
        if pod is None:
            # Not running here (finished already, or never started): say so, so the placer converges.
            self._transition(PodExited(node_id=self.node_id, job_id=cmd.job_id, pod=cmd.pod, exit_code=None,
                                       reason=ExitReason.STOPPED, message="not running on this node"))
            return CommandAck(ok=True)
        self._log.info("pod_stopping", job_id=cmd.job_id, pod=cmd.pod, grace_s=cmd.grace_s, reason=cmd.reason)
        pod.stopping = True  # now, not when the task runs: a start behind this one waits for it
        asyncio.get_running_loop().create_task(pod.stop(cmd.grace_s))
        return CommandAck(ok=True)

    def _at_limit(self, pod: PodProcess) -> bool:
        self.poll_memory()
        s = self.state.get(pod.key)
        return bool(s and s.gpus.memory_limit_bytes and s.peak_bytes >= AT_LIMIT_RATIO * s.gpus.memory_limit_bytes)

    async def _on_exit(self, pod: PodProcess, rc: int, reason: ExitReason, sig: int | None, message: str) -> None:
        self.poll_memory()  # a last look (the simulator still knows the pod; NVML may not any more)
        self.pods.pop(pod.key, None)
        forget_pod(self.pids_dir, pod.key)
        s = self.state.pop(pod.key, None)
        self.backend.pod_exited(pod.key)
        if s is not None:
            self.release_mig(s.mig)  # before PodExited: the placer may hand these slots out at once
        self._log.info("pod_exited", job_id=pod.cmd.job_id, pod=pod.cmd.pod, exit_code=rc, reason=reason.value,
                       peak_memory_bytes=s.peak_bytes if s else None)
        exited = PodExited(node_id=self.node_id, job_id=pod.cmd.job_id, pod=pod.cmd.pod,
                           exit_code=rc, signal=sig, reason=reason, message=message,
                           checkpointed=pod.checkpointed,
                           peak_memory_bytes=s.peak_bytes if s else None,
                           memory_limit_bytes=(s.gpus.memory_limit_bytes or None) if s else None)
        self.recent_exits[pod.key] = exited
        while len(self.recent_exits) > RECENT_EXITS:
            self.recent_exits.pop(next(iter(self.recent_exits)))
        self._transition(exited)

    # ------------------------------------------------------------ MIG
    def resolve_gpus(self, cmd: StartPod) -> tuple[list[str], PodMig]:
        """The UUIDs the pod gets: GPUs as assigned, MIG instances found or created (dynamic MIG).

        Synchronous on purpose: no other command can interleave between the checks and the changes.
        """
        mig = PodMig()
        uuids = []
        try:
            for g in cmd.gpus:
                uuids.append(self._mig_instance(g, mig) if g.mig_profile else g.uuid)
        except MigError:
            self.release_mig(mig)
            raise
        return uuids, mig

    def _in_use(self) -> tuple[set[str], set[int]]:
        """MIG UUIDs held by running pods, and GPUs held whole or shared (not through MIG)."""
        migs = {s.gpus.mig_uuid for s in self.state.values() if s.gpus.mig_uuid}
        plain = {i for s in self.state.values() if not s.gpus.mig_uuid for i in s.gpus.gpus}
        return migs, plain

    def _mig_instance(self, g: GpuAssignment, mig: PodMig) -> str:
        i, profile = g.index, str(g.mig_profile)
        gpu = self.node.gpus[i]
        table = profiles_for(gpu.model)
        if not gpu.mig_capable or not table:
            raise MigError(f"GPU {i} ({gpu.model}) is not MIG-capable")
        if profile not in table:
            raise MigError(f"profile {profile} is not valid on GPU {i} ({gpu.model}); valid: {sorted(table)}")
        p = table[profile]
        in_use, plain = self._in_use()
        if not self.backend.mig_mode(i):
            if not self.settings.mig_auto_enable:
                raise MigError(f"MIG mode is off on GPU {i}; enable it (nvidia-smi -i {i} -mig 1) "
                               "or let the agent do it (TIDE_MIG_AUTO_ENABLE=true)")
            if i in plain:
                raise MigError(f"MIG mode is off on GPU {i} and pods use it whole or shared")
            self.backend.set_mig_mode(i, True)  # MigError when a reset would be needed
            mig.enabled.append(i)
            self._log.info("mig_mode_enabled", gpu=i)
        existing = self.backend.mig_instances(i)
        start = g.mig_start
        if start is None:  # the placer did not say where: an idle instance of the profile, else the first free start
            idle = [m for m in existing if m.profile == profile and m.uuid not in in_use]
            if idle:
                return str(idle[0].uuid)
            start = next((st for st in p.starts if not any(_overlaps(table, m, st, p.size) for m in existing)),
                         p.starts[0])
        for m in existing:
            if m.profile == profile and m.start == start:
                if m.uuid in in_use:
                    raise MigError(f"GPU {i}: {profile}@{start} is in use by another pod")
                return str(m.uuid)
        for m in existing:
            if _overlaps(table, m, start, p.size):
                if m.uuid in in_use:
                    raise MigError(f"GPU {i}: {profile}@{start} overlaps {m.profile}@{m.start}, which is in use")
                self.backend.destroy_mig(i, str(m.uuid))
                mig.destroyed.append((i, m.profile, m.start))
                self._log.info("mig_destroyed", gpu=i, profile=m.profile, start=m.start, why="repartition")
        uuid = self.backend.create_mig(i, profile, start)
        mig.created.append((i, uuid))
        self._log.info("mig_created", gpu=i, profile=profile, start=start, uuid=uuid)
        return uuid

    def release_mig(self, mig: PodMig) -> None:
        """Undo a pod's MIG changes: destroy what was created, re-create what was destroyed, MIG mode back."""
        for i, uuid in reversed(mig.created):
            try:
                self.backend.destroy_mig(i, uuid)
            except MigError as exc:
                self._log.error("mig_destroy_failed", gpu=i, uuid=uuid, error=str(exc))
        for i, profile, start in mig.destroyed:
            try:
                self.backend.create_mig(i, profile, start)
            except MigError as exc:
                self._log.error("mig_recreate_failed", gpu=i, profile=profile, start=start, error=str(exc))
        for i in mig.enabled:
            try:
                if not self.backend.mig_instances(i):
                    self.backend.set_mig_mode(i, False)
            except MigError as exc:
                self._log.error("mig_mode_restore_failed", gpu=i, error=str(exc))
        mig.created, mig.destroyed, mig.enabled = [], [], []


def _overlaps(table: dict, m: MigInstanceDescription, start: int, size: int) -> bool:
    q = table[m.profile]
    return m.start < start + size and start < m.start + q.size


def network_bytes(pid: int) -> int | None:
    """rx+tx bytes of a pod's own network namespace; None when it shares the host's (not attributable)."""
    try:
        if os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            return None
        total = 0
        with open(f"/proc/{pid}/net/dev") as f:
            for line in f.readlines()[2:]:
                name, data = line.split(":", 1)
                if name.strip() == "lo":
                    continue
                cols = data.split()
                total += int(cols[0]) + int(cols[8])
        return total
    except (OSError, ValueError, IndexError):
        return None
