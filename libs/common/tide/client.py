"""A small async client for users, scripts, the CLI and the tests: submit, status, cancel, watch."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS

from tide import subjects
from tide.bus.nats import connect
from tide.schemas.events import TERMINAL_STATES, CancelJob, JobEvent, JobState, new_event_id
from tide.schemas.feedback import family_of
from tide.schemas.job import JobSpec
from tide.settings import Settings

FINAL_FOR_WAIT = {s.value for s in TERMINAL_STATES} | {JobState.UNSCHEDULABLE.value}


@dataclass
class SubmitResult:
    job_id: str
    accepted: bool
    field: str = ""
    reason: str = ""


def new_job_id(name: str) -> str:
    return f"{name[:40]}-{secrets.token_hex(3)}"


class TideClient:
    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.js = nc.jetstream()

    @classmethod
    async def connect(cls, settings: Settings) -> TideClient:
        return cls(await connect(settings, "tide-cli"))

    async def close(self) -> None:
        await self.nc.close()

    async def submit(self, spec: Any, job_id: str | None = None, timeout_s: float = 15.0) -> SubmitResult:
        """Publish a job spec and wait for the queue's verdict (queued or rejected)."""
        if job_id is None:
            name = spec.get("metadata", {}).get("name") if isinstance(spec, dict) else None
            job_id = new_job_id(name if isinstance(name, str) and name else "job")
        payload = json.dumps({"schema_version": 1, "event_id": new_event_id(), "job_id": job_id, "spec": spec})
        return await self.submit_raw(payload.encode(), job_id, timeout_s)

    async def submit_raw(self, data: bytes, job_id: str, timeout_s: float = 15.0) -> SubmitResult:
        verdict: asyncio.Future[JobEvent] = asyncio.get_running_loop().create_future()

        async def on_event(msg: Any) -> None:
            event = JobEvent.model_validate_json(msg.data)
            if event.kind in ("queued", "rejected") and not verdict.done():
                verdict.set_result(event)

        sub = await self.nc.subscribe(subjects.job_events(job_id), cb=on_event)
        try:
            await self.js.publish(subjects.JOB_SUBMIT, data, headers={"Tide-Job-Id": job_id})
            event = await asyncio.wait_for(verdict, timeout=timeout_s)
        finally:
            await sub.unsubscribe()
        if event.kind == "rejected":
            field, _, reason = event.reason.partition(": ")
            return SubmitResult(job_id, False, field, reason)
        return SubmitResult(job_id, True)

    async def status(self, job_id: str | None = None, limit: int = 50) -> dict[str, Any]:
        req = {"job_id": job_id} if job_id else {"limit": limit}
        reply = await self.nc.request(subjects.API_STATUS, json.dumps(req).encode(), timeout=5)
        return json.loads(reply.data)

    async def job(self, job_id: str) -> dict[str, Any] | None:
        """The job's status summary, or None when unknown."""
        body = await self.status(job_id)
        if body.get("jobs"):
            return summarize(body["jobs"][0])
        if body.get("rejected"):
            r = body["rejected"]
            return {"job_id": job_id, "state": "rejected", "reason": f"{r['field']}: {r['reason']}", "pods": []}
        return None

    async def wait(self, job_id: str, states: set[str] | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
        """Wait until the job reaches one of ``states`` (default: a final state)."""
        states = states or FINAL_FOR_WAIT
        changed = asyncio.Event()

        async def on_event(msg: Any) -> None:
            changed.set()

        sub = await self.nc.subscribe(subjects.job_events(job_id), cb=on_event)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                job = await self.job(job_id)
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
            await sub.unsubscribe()

    async def cancel(self, job_id: str, reason: str = "cancelled by user") -> None:
        message = CancelJob(job_id=job_id, reason=reason)
        await self.js.publish(subjects.JOB_CANCEL, message.to_bytes(), headers={"Nats-Msg-Id": message.event_id})

    async def nodes(self) -> list[dict[str, Any]]:
        reply = await self.nc.request(subjects.API_NODES, b"{}", timeout=5)
        return json.loads(reply.data)["nodes"]

    async def queues(self) -> dict[str, Any]:
        reply = await self.nc.request(subjects.API_QUEUES, b"{}", timeout=5)
        return json.loads(reply.data)["queues"]

    async def apply_queues(self, config: Any) -> dict[str, Any]:
        """Replace the queue tree at run time; returns {"ok": True, "queues": [...]} or {"ok": False, "error"}."""
        reply = await self.nc.request(subjects.API_QUEUES_APPLY, json.dumps(config).encode(), timeout=5)
        return json.loads(reply.data)

    async def weights(self, family: str | None = None, limit: int = 20) -> dict[str, Any]:
        """The feedback loop's family weights and recent changes (served by the metrics service)."""
        req: dict[str, Any] = {"limit": limit} | ({"family": family} if family else {})
        try:
            reply = await self.nc.request(subjects.API_WEIGHTS, json.dumps(req).encode(), timeout=3)
        except Exception:
            return {"families": [], "history": []}
        return json.loads(reply.data)

    async def events(self) -> AsyncIterator[JobEvent]:
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
