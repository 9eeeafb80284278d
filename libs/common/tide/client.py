"""A small async client for users, scripts, the CLI and the tests: submit, status, cancel, watch."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DeliverPolicy

from tide import subjects
from tide.bus.dead_letters import DeadLetter, is_job_token
from tide.bus.nats import connect, nats_servers
from tide.schemas.events import TERMINAL_STATES, CancelJob, JobEvent, JobState, new_event_id
from tide.schemas.feedback import family_of
from tide.schemas.job import JobSpec
from tide.settings import Settings
from tide.tracing import trace_headers

TENANT_NO_WATCH = ("`tide watch` streams every job's events, so it is the admin's; a tenant follows its own jobs "
                   "with `tide status`, `tide describe JOB` and `tide wait`/`--wait`")
FINAL_FOR_WAIT = {s.value for s in TERMINAL_STATES} | {JobState.UNSCHEDULABLE.value}


@dataclass
class SubmitResult:
    job_id: str
    accepted: bool
    field: str = ""
    reason: str = ""


class ServiceUnavailable(Exception):
    """A Tide service (or NATS itself) does not answer; the message is one line for the CLI."""

    def __init__(self, service: str, url: str, detail: str = "") -> None:
        who = "NATS" if service == "nats" else f"the {service} service"
        super().__init__(f"{who} is not answering at {url} (is 'tide up' running?){detail}")
        self.service = service


class NodeNotAnswering(Exception):
    """A node agent does not answer (its node is gone, or the agent is down)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {node_id} is not answering (its agent is down or the node is gone)")
        self.node_id = node_id


# which service answers which request subject
SERVICE_OF = {
    subjects.API_STATUS: "queue",
    subjects.API_HISTORY: "queue",
    subjects.API_LOGS: "queue",
    subjects.API_QUEUES: "queue",
    subjects.API_QUEUES_APPLY: "queue",
    subjects.API_NODES: "placer",
    subjects.API_WEIGHTS: "metrics",
}


def new_job_id(name: str) -> str:
    return f"{name[:40]}-{secrets.token_hex(3)}"


def nats_reachable(url: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts TCP connections at the NATS URL within ``timeout_s`` (asked before connecting:
    nats-py would retry forever)."""
    parsed = [urlparse(u) for u in nats_servers(url)]  # several servers (HA): any one will do
    deadline = time.monotonic() + timeout_s
    while True:
        for p in parsed:
            try:
                with socket.create_connection((p.hostname or "127.0.0.1", p.port or 4222), timeout=timeout_s):
                    return True
            except OSError:
                pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


class TideClient:
    def __init__(self, nc: NATS, url: str = "", tenant: str | None = None) -> None:
        """``tenant``: act as this tenant (docs/security.md): its own submit, cancel and status subjects, and
        no job events (a tenant may not subscribe to them): verdicts and waits are polled."""
        self.tenant = tenant
        self.submit_subject = subjects.job_submit_as(tenant) if tenant else subjects.JOB_SUBMIT
        self.cancel_subject = subjects.job_cancel_as(tenant) if tenant else subjects.JOB_CANCEL
        self.status_subject = subjects.api_status_as(tenant) if tenant else subjects.API_STATUS
        # a tenant may not read the EVENTS and DLQ streams nor ask nodes for logs: the queue does it for it,
        # for its own jobs only (docs/security.md)
        self.history_subject = subjects.api_history_as(tenant) if tenant else None
        self.logs_subject = subjects.api_logs_as(tenant) if tenant else None
        # the feedback weights: a tenant's own subject, on which the metrics service shows only its jobs' families
        self.weights_subject = subjects.api_weights_as(tenant) if tenant else subjects.API_WEIGHTS
        self.nc = nc
        self.js = nc.jetstream()
        self.url = url or (str(nc.connected_url.geturl()) if nc.connected_url else "")

    @classmethod
    async def connect(cls, settings: Settings) -> TideClient:
        """Connect (and reconnect after outages); raises ServiceUnavailable at once when NATS is not there."""
        if not await asyncio.to_thread(nats_reachable, settings.nats_url):
            raise ServiceUnavailable("nats", settings.nats_url)

        async def quiet(exc: Exception) -> None:
            pass

        try:
            nc = await asyncio.wait_for(
                connect(settings, "tide-cli", inbox_prefix=f"_INBOX_{settings.user}" if settings.user else None,
                        error_cb=quiet), timeout=10)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise ServiceUnavailable("nats", settings.nats_url, f": {exc}" if str(exc) else "") from exc
        return cls(nc, settings.nats_url, tenant=settings.user)

    async def close(self) -> None:
        await self.nc.close()

    async def request(self, subject: str, data: bytes, timeout_s: float = 5.0) -> Any:
        """A request to a service's API; ServiceUnavailable when nobody answers."""
        try:
            reply = await self.nc.request(self._as_user(subject), data, timeout=timeout_s)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError, TimeoutError) as exc:
            raise ServiceUnavailable(SERVICE_OF.get(subject, subject), self.url) from exc
        return json.loads(reply.data)

    def _as_user(self, subject: str) -> str:
        """The subject this client sends an API request on: a tenant's own for status, history, logs and weights."""
        mine = {subjects.API_STATUS: self.status_subject, subjects.API_HISTORY: self.history_subject,
                subjects.API_LOGS: self.logs_subject, subjects.API_WEIGHTS: self.weights_subject}
        return mine.get(subject) or subject

    async def submit(
        self, spec: Any, job_id: str | None = None, timeout_s: float = 15.0, attempts: int = 3
    ) -> SubmitResult:
        """Publish a job spec and wait for the queue's verdict (queued or rejected).

        The job id is chosen here, once, and every attempt carries it: the queue treats a second submission
        of an id it knows (with the same spec) as the same job, so a retry never makes a second job. Nothing
        is published while no queue service is subscribed (ServiceUnavailable): a submission left in the
        stream would otherwise become a job whenever the queue came back."""
        if job_id is None:
            name = spec.get("metadata", {}).get("name") if isinstance(spec, dict) else None
            job_id = new_job_id(name if isinstance(name, str) and name else "job")
        payload = json.dumps({"schema_version": 1, "event_id": new_event_id(), "job_id": job_id, "spec": spec})
        await self._queue_present()
        per_attempt = timeout_s / max(1, attempts)
        for _ in range(max(1, attempts)):
            try:
                return await self.submit_raw(payload.encode(), job_id, per_attempt)
            except TimeoutError:
                known = await self._known(job_id)  # the verdict was lost, or the queue is slow
                if known is not None:
                    return known
        raise TimeoutError(f"the queue gave no verdict on job {job_id} in {timeout_s:g}s; submitting again with "
                           f"--job-id {job_id} is safe (the queue keeps one job per id)")

    async def _queue_present(self) -> None:
        """ServiceUnavailable unless a queue service is subscribed (a busy one that is slow to answer is present)."""
        try:
            await self.nc.request(self.status_subject, b'{"limit": 1}', timeout=2)
        except nats.errors.NoRespondersError as exc:
            raise ServiceUnavailable("queue", self.url) from exc
        except (nats.errors.TimeoutError, TimeoutError):
            pass

    async def _known(self, job_id: str) -> SubmitResult | None:
        try:
            job = await self.job(job_id, timeout_s=2)
        except ServiceUnavailable:
            return None
        if job is None:
            return None
        if job["state"] == "rejected":
            field, _, reason = job["reason"].partition(": ")
            return SubmitResult(job_id, False, field, reason)
        return SubmitResult(job_id, True)

    async def submit_raw(self, data: bytes, job_id: str, timeout_s: float = 15.0) -> SubmitResult:
        if self.tenant:
            return await self._submit_polled(data, job_id, timeout_s)
        verdict: asyncio.Future[JobEvent] = asyncio.get_running_loop().create_future()

        async def on_event(msg: Any) -> None:
            event = JobEvent.model_validate_json(msg.data)
            if event.kind in ("queued", "rejected") and not verdict.done():
                verdict.set_result(event)

        sub = await self.nc.subscribe(subjects.job_events(job_id), cb=on_event)
        try:
            # a program submitting under a span of its own: the job joins its trace (docs/observability.md)
            await self.js.publish(subjects.JOB_SUBMIT, data, headers=trace_headers({"Tide-Job-Id": job_id}))
            event = await asyncio.wait_for(verdict, timeout=timeout_s)
        finally:
            await sub.unsubscribe()
        if event.kind == "rejected":
            field, _, reason = event.reason.partition(": ")
            return SubmitResult(job_id, False, field, reason)
        return SubmitResult(job_id, True)

    async def _submit_polled(self, data: bytes, job_id: str, timeout_s: float) -> SubmitResult:
        """A tenant's submission: publish on its subject, then ask for the job until the queue has a verdict."""
        await self.js.publish(self.submit_subject, data, headers=trace_headers({"Tide-Job-Id": job_id}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            known = await self._known(job_id)
            if known is not None:
                return known
            await asyncio.sleep(0.1)
        raise TimeoutError(f"no verdict on job {job_id} in {timeout_s:g}s")

    async def status(self, job_id: str | None = None, limit: int = 50, timeout_s: float = 5.0) -> dict[str, Any]:
        req = {"job_id": job_id} if job_id else {"limit": limit}
        body: dict[str, Any] = await self.request(subjects.API_STATUS, json.dumps(req).encode(), timeout_s)
        return body

    async def job(self, job_id: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """The job's status summary, or None when unknown."""
        body = await self.status(job_id, timeout_s=timeout_s)
        if body.get("jobs"):
            return summarize(body["jobs"][0])
        if body.get("rejected"):
            r = body["rejected"]
            return {"job_id": job_id, "state": "rejected", "reason": f"{r['field']}: {r['reason']}", "pods": []}
        return None

    async def wait(self, job_id: str, states: set[str] | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
        """Wait until the job reaches one of ``states`` (default: a final state). A queue that is restarting
        meanwhile is waited for; ServiceUnavailable only if it is still gone at the deadline."""
        states = states or FINAL_FOR_WAIT
        changed = asyncio.Event()

        async def on_event(msg: Any) -> None:
            changed.set()

        # a tenant may not subscribe to job events: it polls (each second, as below)
        sub = None if self.tenant else await self.nc.subscribe(subjects.job_events(job_id), cb=on_event)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    job = await self.job(job_id, timeout_s=max(0.5, min(5.0, deadline - time.monotonic())))
                except ServiceUnavailable:
                    if time.monotonic() >= deadline:
                        raise
                    job = None
                if job is not None and job["state"] in states:
                    return job
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id} still {job and job['state']} after {timeout_s}s")
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), timeout=min(1.0, left))
                except TimeoutError:
                    pass
        finally:
            if sub is not None:
                await sub.unsubscribe()

    async def cancel(self, job_id: str, reason: str = "cancelled by user") -> None:
        message = CancelJob(job_id=job_id, reason=reason)
        await self.js.publish(self.cancel_subject, message.to_bytes(), headers={"Nats-Msg-Id": message.event_id})

    async def nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = (await self.request(subjects.API_NODES, b"{}"))["nodes"]
        return nodes

    async def queues(self) -> dict[str, Any]:
        queues: dict[str, Any] = (await self.request(subjects.API_QUEUES, b"{}"))["queues"]
        return queues

    async def apply_queues(self, config: Any) -> dict[str, Any]:
        """Replace the queue tree at run time; returns {"ok": True, "queues": [...]} or {"ok": False, "error"}."""
        result: dict[str, Any] = await self.request(subjects.API_QUEUES_APPLY, json.dumps(config).encode())
        return result

    async def weights(self, family: str | None = None, limit: int = 20) -> dict[str, Any]:
        """The feedback loop's family weights and recent changes (served by the metrics service); a tenant's
        only: the families of its own jobs and the changes its jobs caused."""
        req: dict[str, Any] = {"limit": limit} | ({"family": family} if family else {})
        try:
            reply = await self.nc.request(self.weights_subject, json.dumps(req).encode(), timeout=3)
        except Exception:
            return {"families": [], "history": []}
        return json.loads(reply.data)

    async def node_logs(self, node_id: str, request: dict[str, Any], timeout_s: float = 3.0) -> dict[str, Any]:
        """Ask a node agent for pod logs (tide_node_agent/logs.py has the request and reply); NodeNotAnswering
        when it does not answer. A tenant's request goes through the queue, which forwards it only for the
        tenant's own job (else ``{"ok": false, "error": "no job ..."}``)."""
        if self.tenant:
            body = await self.request(subjects.API_LOGS, json.dumps(
                {"node": node_id, "request": request, "timeout_s": timeout_s}).encode(), timeout_s + 2.0)
            if body.get("unreachable"):
                raise NodeNotAnswering(node_id)
            return dict(body)
        try:
            reply = await self.nc.request(subjects.node_logs(node_id), json.dumps(request).encode(),
                                          timeout=timeout_s)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError, TimeoutError) as exc:
            raise NodeNotAnswering(node_id) from exc
        body: dict[str, Any] = json.loads(reply.data)
        return body

    async def job_history(self, job_id: str, idle_s: float = 1.0) -> list[JobEvent]:
        """Every event of the job kept in the EVENTS stream, oldest first (an ordered consumer of
        ``tide.events.job.<id>.>``, read until nothing is pending). A tenant asks the queue, which answers only
        for the tenant's own job (none otherwise)."""
        if self.tenant:
            body = await self._history(job_id)
            return [JobEvent.model_validate(e) for e in body.get("events", [])]
        sub = await self.js.subscribe(subjects.job_events(job_id), stream="EVENTS", ordered_consumer=True,
                                      deliver_policy=DeliverPolicy.ALL)
        found: list[JobEvent] = []
        for msg in await _replayed(sub, idle_s):
            try:
                found.append(JobEvent.model_validate_json(msg.data))
            except ValueError:
                pass
        return found

    async def dead_letters(self, job_id: str, idle_s: float = 1.0) -> list[DeadLetter]:
        """The job's dead letters kept in the DLQ stream (``tide.dlq.*.<job id>``), oldest first; none when the
        id cannot be a subject token or the stack has no DLQ stream (an older stack). A tenant's come from the
        queue: those of its own job, and of messages it sent itself naming the id."""
        if not is_job_token(job_id):
            return []
        if self.tenant:
            body = await self._history(job_id)
            return [DeadLetter.model_validate(d) for d in body.get("dead_letters", [])]
        try:
            sub = await self.js.subscribe(subjects.job_dead_letters(job_id), stream="DLQ", ordered_consumer=True,
                                          deliver_policy=DeliverPolicy.ALL)
        except nats.js.errors.NotFoundError:
            return []
        letters = [DeadLetter.from_headers(msg.headers) for msg in await _replayed(sub, idle_s)]
        return [letter for letter in letters if letter is not None]

    async def _history(self, job_id: str) -> dict[str, Any]:
        body: dict[str, Any] = await self.request(subjects.API_HISTORY, json.dumps({"job_id": job_id}).encode())
        return body

    async def events(self) -> AsyncIterator[JobEvent]:
        """Every job's events as they happen (the admin's only: a tenant may not subscribe to them)."""
        if self.tenant:
            raise PermissionError(TENANT_NO_WATCH)
        sub = await self.nc.subscribe(subjects.JOB_EVENTS_ALL)
        try:
            async for msg in sub.messages:
                yield JobEvent.model_validate_json(msg.data)
        finally:
            await sub.unsubscribe()


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """The status contract: job_id, state, reason, pods (name, state, node, gpus) and a few extras."""
    meta = record["spec"]["metadata"]
    return {
        "job_id": record["job_id"],
        "state": record["state"],
        "reason": record["reason"],
        "queue": meta.get("queue", "default"),
        "priority_class": meta.get("priorityClass", "offline-training"),
        "submitted_at": record["submitted_at"],
        "started_at": record.get("started_at"),
        "finished_at": record.get("finished_at"),
        "attempts": record.get("attempts", 0),
        "family": family_of(JobSpec.model_validate(record["spec"])),
        "pods": [
            {
                "name": p["name"],
                "state": p["state"],
                "node": p["node"],
                "gpus": p["gpus"],
                "exit_code": p.get("exit_code"),
                "reason": p.get("reason"),
            }
            for p in record["pods"]
        ],
    }


async def _replayed(sub: Subscription, idle_s: float) -> list[Msg]:
    """Every message an ordered consumer replays from a stream (until none is pending, or ``idle_s`` passes
    without one), then unsubscribed."""
    out: list[Msg] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=idle_s)
            except (nats.errors.TimeoutError, TimeoutError):
                break
            out.append(msg)
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out
