"""The placer service: cluster state, placement, atomic claims, binding pods to node agents."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import structlog
from nats.aio.msg import Msg
from opentelemetry import trace
from tide import subjects
from tide.bus.nats import close_nats, connect, consume, ensure_streams
from tide.core import DEFAULT_POLICY, Allocation, Cluster, OversubscriptionError, Placer, Unfit
from tide.events import publish_job_event
from tide.schemas.events import (
    NODE_STATUS,
    POD_DONE_STATES,
    TERMINAL_STATES,
    CommandAck,
    ExitReason,
    GpuAssignment,
    JobRecord,
    JobState,
    NodeRegistered,
    PodExited,
    PodStarted,
    PodState,
    StartPod,
    StopPod,
    Telemetry,
)
from tide.schemas.node import NodeDescription
from tide.settings import Settings
from tide.store import keys
from tide.store.claims import ClaimItem, ClaimStore, PodClaim
from tide.store.jobs import JobStore
from tide.store.redis import connect_redis
from tide.tracing import job_span

from tide_placer.outcome import mark_pod_exited, mark_pod_started
from tide_placer.placement import PodPlacement, claim_items, place_job, pod_request

log = structlog.get_logger()
tracer = trace.get_tracer("tide.placer")


class PlacerService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.last_seen: dict[str, float] = {}
        self._kick = asyncio.Event()
        policy = DEFAULT_POLICY if settings.placer_policy == "default" else settings.placer_policy
        self.placer = Placer(policy=policy)
        self._cycle_lock = asyncio.Lock()

    async def start(self) -> None:
        self.nc = await connect(self.settings, "tide-placer")
        self.js = self.nc.jetstream()
        await ensure_streams(self.js)
        self.redis = connect_redis(self.settings.redis_url)
        self.jobs = JobStore(self.redis)
        self.claims = ClaimStore(self.redis)
        await self.nc.subscribe(subjects.PLACER_KICK, cb=self._on_kick)
        await self.nc.subscribe(subjects.API_NODES, cb=self._api_nodes)
        await self.nc.subscribe(subjects.TELEMETRY_ALL, cb=self._on_telemetry)

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(
            consume(self.js, subjects.PLACER_NODE_STATUS, self._on_node_status, stop),
            self._cycle_loop(stop),
        )

    async def close(self) -> None:
        await close_nats(self.nc)
        await self.redis.aclose()

    # ------------------------------------------------------------ triggers
    async def _on_kick(self, msg: Msg) -> None:
        self._kick.set()

    async def _on_telemetry(self, msg: Msg) -> None:
        try:
            t = Telemetry.model_validate_json(msg.data)
        except ValueError:
            return
        self.last_seen[t.node_id] = time.time()

    async def _cycle_loop(self, stop: asyncio.Event) -> None:
        async def wait_and_cycle() -> None:
            try:
                await asyncio.wait_for(self._kick.wait(), timeout=self.settings.placer_tick_s)
            except TimeoutError:
                pass
            self._kick.clear()
            await self.cycle()

        while not stop.is_set():
            try:
                await wait_and_cycle()
            except Exception as exc:
                log.exception("cycle_failed", error=repr(exc))
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------ the scheduling cycle
    async def cycle(self) -> None:
        async with self._cycle_lock:
            await self._process_stop_requests()
            await self._place_pending()

    async def load_cluster(self) -> tuple[list[NodeDescription], Cluster]:
        """The cluster as Redis holds it: registered nodes minus every claim."""
        nodes = await self.claims.nodes()
        cluster = Cluster.from_descriptions(nodes)
        for key, alloc in (await self.claims.all_claims()).items():
            try:
                cluster.allocate(Allocation.from_dict(alloc))
            except (OversubscriptionError, KeyError) as exc:
                log.warning("claim_replay_failed", claim=key, error=str(exc))
        return nodes, cluster

    async def _place_pending(self) -> None:
        pending = await self.jobs.pending()
        if not pending:
            return
        nodes, cluster = await self.load_cluster()
        if not nodes:
            return
        for job_id in pending:
            record = await self.jobs.get(job_id)
            if record is None or record.state in TERMINAL_STATES or record.cancel_requested:
                await self.jobs.dequeue(job_id)
                continue
            if record.state not in (JobState.PENDING, JobState.UNSCHEDULABLE):
                await self.jobs.dequeue(job_id)
                continue
            result = place_job(self.placer, cluster, record.spec, nodes)
            if isinstance(result, Unfit):
                await self._not_placed(record, result)
                continue
            with job_span(tracer, "placer.bind", job_id, pods=len(result)):
                bound = await self._bind(record, result, nodes)
            if bound:
                for p in result:
                    self.placer.observe(pod_request(record.spec))
                    cluster.allocate(p.alloc)
            else:
                nodes, cluster = await self.load_cluster()

    async def _not_placed(self, record: JobRecord, unfit: Unfit) -> None:
        state = JobState.PENDING if unfit.resolvable else JobState.UNSCHEDULABLE
        if record.state == state and record.reason == unfit.reason:
            return

        def change(r: JobRecord) -> bool:
            if r.state not in (JobState.PENDING, JobState.UNSCHEDULABLE) or r.cancel_requested:
                return False
            r.state, r.reason = state, unfit.reason
            return True

        updated = await self.jobs.update(record.job_id, change)
        if updated is not None and state == JobState.UNSCHEDULABLE:
            log.info("job_unschedulable", job_id=record.job_id, reason=unfit.reason)
            await publish_job_event(self.js, updated, "unschedulable")

    async def _bind(self, record: JobRecord, placements: list[PodPlacement], nodes: list[NodeDescription]) -> bool:
        """Claim every pod's slots atomically, then start each pod on its node.

        Returns True when the claims were taken (the cluster view must then include them).
        """
        job_id = record.job_id
        by_id = {n.node_id: n for n in nodes}
        assignments = {p.pod_index: gpu_assignments(by_id[p.alloc.node_id], p.alloc) for p in placements}
        claims = [
            PodClaim(
                job_id=job_id,
                pod=record.pods[p.pod_index].name,
                items=tuple(ClaimItem(n, f, a) for n, f, a in claim_items(
                    p.alloc, {g.index: g.model for g in by_id[p.alloc.node_id].gpus})),
                alloc=p.alloc.to_dict(),
            )
            for p in placements
        ]
        ok, why = await self.claims.claim(claims)
        if not ok:
            log.info("claim_lost", job_id=job_id, reason=why)
            return False
        attempt = record.attempts + 1

        def assign(r: JobRecord) -> bool:
            if r.state not in (JobState.PENDING, JobState.UNSCHEDULABLE) or r.cancel_requested:
                return False
            r.state, r.reason, r.attempts = JobState.PENDING, "starting", attempt
            for p in placements:
                pod = r.pods[p.pod_index]
                pod.node, pod.state = p.alloc.node_id, PodState.STARTING
                pod.gpus = [g.uuid for g in assignments[p.pod_index]]
                pod.exit_code = pod.reason = None
            return True

        updated = await self.jobs.update(job_id, assign)
        if updated is None:  # cancelled meanwhile
            await self.claims.release([c.key for c in claims])
            return False
        await self.jobs.dequeue(job_id)
        log.info("job_placed", job_id=job_id, nodes=sorted({p.alloc.node_id for p in placements}))
        await publish_job_event(
            self.js, updated, "placed", wait_s=time.time() - updated.submitted_at, reason="placed"
        )
        tmpl = updated.spec.spec.template
        share = tmpl.resources.gpu_share
        results = await asyncio.gather(
            *[
                self._send(
                    p.alloc.node_id,
                    StartPod(
                        event_id=f"{job_id}.{updated.pods[p.pod_index].name}.start.{attempt}",
                        job_id=job_id,
                        pod=updated.pods[p.pod_index].name,
                        pod_index=p.pod_index,
                        world_size=len(placements),
                        command=tmpl.command,
                        env=tmpl.env,
                        gpus=assignments[p.pod_index],
                        share_sm_percent=share.sm_percent if share else None,
                        share_memory_mib=share.memory_mib if share else None,
                        cpu_milli=p.alloc.cpu_milli,
                        memory_mib=p.alloc.memory_mib,
                    ),
                )
                for p in placements
            ]
        )
        failures = [f"{p.alloc.node_id}: {err}" for p, err in zip(placements, results, strict=True) if err]
        if failures:
            await self._rollback(job_id, "; ".join(failures))
        return True

    async def _send(self, node_id: str, command: StartPod | StopPod) -> str:
        """Send a command to a node agent; returns '' on acknowledgement, else the error."""
        try:
            reply = await self.nc.request(
                subjects.node_cmd(node_id), command.to_bytes(), timeout=self.settings.start_ack_timeout_s
            )
            ack = CommandAck.model_validate_json(reply.data)
            return "" if ack.ok else (ack.error or "refused")
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            return f"no acknowledgement ({type(exc).__name__})"

    async def _rollback(self, job_id: str, why: str) -> None:
        """A pod could not be started: stop the ones that did, release every claim, requeue."""
        log.warning("job_rollback", job_id=job_id, reason=why)
        record = await self.jobs.get(job_id)
        if record is None:
            return
        for pod in record.pods:
            if pod.node and pod.state not in POD_DONE_STATES:
                await self._send(pod.node, StopPod(job_id=job_id, pod=pod.name, grace_s=0, reason="rollback"))
        await self.claims.release([keys.claim(job_id, p.name) for p in record.pods])

        def back_to_pending(r: JobRecord) -> bool:
            r.state, r.reason = JobState.PENDING, f"start failed, requeued: {why}"
            for p in r.pods:
                p.node, p.gpus, p.state, p.exit_code = None, [], PodState.PENDING, None
            return True

        updated = await self.jobs.update(job_id, back_to_pending)
        if updated is not None:
            await self.jobs.requeue(job_id, updated.submitted_at)
            await publish_job_event(self.js, updated, "requeued")

    async def _process_stop_requests(self) -> None:
        for job_id in await self.jobs.stop_requests():
            record = await self.jobs.get(job_id)
            if record is None:
                await self.jobs.stop_done(job_id)
                continue
            live = [p for p in record.pods if p.node and p.state not in POD_DONE_STATES]
            if not live:
                await self.jobs.stop_done(job_id)
                if record.cancel_requested and record.state not in TERMINAL_STATES:
                    await self._finish_cancel(job_id)
                continue
            grace = record.spec.spec.grace_period_s
            for pod in live:
                err = await self._send(pod.node or "", StopPod(job_id=job_id, pod=pod.name, grace_s=grace,
                                                                reason=record.reason or "stop"))
                if err:  # the node is gone: the pod is as good as stopped
                    await self._pod_exited(PodExited(node_id=pod.node or "", job_id=job_id, pod=pod.name,
                                                     exit_code=None, reason=ExitReason.LOST, message=err))

    async def _finish_cancel(self, job_id: str) -> None:
        def cancel(r: JobRecord) -> bool:
            if r.state in TERMINAL_STATES:
                return False
            r.state, r.finished_at = JobState.CANCELLED, time.time()
            return True

        updated = await self.jobs.update(job_id, cancel)
        if updated is not None:
            await self.jobs.dequeue(job_id)
            await publish_job_event(self.js, updated, "cancelled")

    # ------------------------------------------------------------ node agents
    async def _on_node_status(self, msg: Msg) -> None:
        try:
            status = NODE_STATUS.validate_json(msg.data)
        except ValueError as exc:
            log.warning("bad_node_status", subject=msg.subject, error=str(exc))
            await msg.term()
            return
        sender = msg.subject.split(".")[2]
        if (status.node.node_id if isinstance(status, NodeRegistered) else status.node_id) != sender:
            log.warning("node_status_id_mismatch", subject=msg.subject)
            await msg.term()
            return
        if isinstance(status, NodeRegistered):
            await self._node_registered(status)
        elif isinstance(status, PodStarted):
            await self._pod_started(status)
        else:
            await self._pod_exited(status)
        await msg.ack()

    async def _node_registered(self, reg: NodeRegistered) -> None:
        node = reg.node
        await self.claims.set_capacity(node)
        self.last_seen[node.node_id] = time.time()
        log.info("node_registered", node_id=node.node_id, gpus=len(node.gpus), running=len(reg.running_pods))
        # Pods we placed on this node that the (restarted) agent no longer runs are lost.
        running = set(reg.running_pods)
        for claim_key, alloc in (await self.claims.all_claims()).items():
            if alloc.get("node_id") != node.node_id:
                continue
            _, _, job_id, pod = claim_key.split(":", 3)
            record = await self.jobs.get(job_id)
            if record is None:
                continue
            pod_rec = next((p for p in record.pods if p.name == pod), None)
            if pod_rec and pod_rec.state == PodState.RUNNING and f"{job_id}/{pod}" not in running:
                await self._pod_exited(PodExited(node_id=node.node_id, job_id=job_id, pod=pod, exit_code=None,
                                                 reason=ExitReason.LOST, message="node agent restarted"))
        self._kick.set()

    async def _pod_started(self, started: PodStarted) -> None:
        turned: list[bool] = []

        def change(r: JobRecord) -> bool:
            turned.append(mark_pod_started(r, started.pod))
            return True

        record = await self.jobs.update(started.job_id, change)
        if record is None:
            return
        await publish_job_event(self.js, record, "pod-started", pod=started.pod, node=started.node_id,
                                state=record.state, reason="")
        if turned and turned[-1]:
            log.info("job_running", job_id=record.job_id)
            await publish_job_event(self.js, record, "running")

    async def _pod_exited(self, exited: PodExited) -> None:
        await self.claims.release([keys.claim(exited.job_id, exited.pod)])
        outcome: list[tuple[JobState | None, list[str]]] = []

        def change(r: JobRecord) -> bool:
            outcome.append(mark_pod_exited(r, exited))
            return True

        record = await self.jobs.update(exited.job_id, change)
        self._kick.set()
        if record is None:
            return
        new_state, to_stop = outcome[-1]
        await publish_job_event(self.js, record, "pod-exited", pod=exited.pod, node=exited.node_id,
                                exit_code=exited.exit_code, reason=exited.reason.value)
        if new_state is not None:
            log.info("job_finished", job_id=record.job_id, state=new_state, reason=record.reason)
            await publish_job_event(self.js, record, new_state.value)
        if to_stop:
            await self.jobs.request_stop(record.job_id)

    # ------------------------------------------------------------ API
    async def _api_nodes(self, msg: Msg) -> None:
        nodes = await self.claims.nodes()
        now = time.time()
        out = []
        for n in nodes:
            used = await self.claims.used(n.node_id)
            out.append({
                "node_id": n.node_id,
                "labels": n.labels,
                "rack": n.rack,
                "gpus": len(n.gpus),
                "gpu_models": sorted({g.model for g in n.gpus}),
                "gpus_used_milli": sum(used.get(f"g{g.index}.milli", 0) for g in n.gpus),
                "cpu_used_milli": used.get("cpu", 0),
                "cpu_milli": n.cpu_milli,
                "last_seen_s": round(now - self.last_seen[n.node_id], 1) if n.node_id in self.last_seen else None,
            })
        await msg.respond(json.dumps({"nodes": out}).encode())


def gpu_assignments(node: NodeDescription, alloc: Allocation) -> list[GpuAssignment]:
    """What the node agent is told to expose: GPU UUIDs (or the MIG instance) with their limits."""
    uuids = {g.index: g.uuid or f"GPU-{node.node_id}-{g.index}" for g in node.gpus}
    out = [
        GpuAssignment(index=i, uuid=uuids[i], milli=m, memory_mib=mem)
        for i, m, mem in zip(alloc.gpu_indices, alloc.gpu_milli, alloc.gpu_mem_mib, strict=True)
    ]
    if alloc.mig is not None:
        mig = alloc.mig
        out.append(GpuAssignment(
            index=mig.gpu_index,
            uuid=f"MIG-{uuids[mig.gpu_index]}/{mig.profile}/{mig.start}",
            milli=0,
            mig_profile=mig.profile,
            mig_start=mig.start,
            mig_create=mig.repartition,
        ))
    return out
