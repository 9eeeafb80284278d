"""`tide logs JOB [POD] [-f] [--attempt N] [--tail N]`: pod output, read from the node agents.

Each agent answers ``tide.node.<id>.logs`` (tide_node_agent/logs.py): which log files of the job it holds
(every attempt, finished pods too) and chunks of one file by offset. The CLI asks the nodes the job's
pods are on plus every node the placer knows (an earlier attempt may have run elsewhere), picks the
pods, and prints them; with several pods each line is prefixed with ``[pod]``.
"""

from __future__ import annotations

import asyncio
import base64
import sys
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from tide.client import FINAL_FOR_WAIT, NodeNotAnswering, ServiceUnavailable, TideClient

POLL_S = 0.5


class LogsError(Exception):
    """One line for the user; exit 1."""


@dataclass
class PodLog:
    job_id: str
    node: str
    pod: str  # the agent's id, <name>.a<attempt>
    name: str
    attempt: int
    offset: int = 0
    started: bool = False
    done: bool = False
    partial: bytes = field(default=b"", repr=False)


def select(found: list[PodLog], pod: str | None, attempt: int | None) -> list[PodLog]:
    """The logs to show: ``pod`` (a name, or a ``<name>.a<attempt>`` id), of ``attempt`` or else each pod's
    latest attempt."""
    chosen = [f for f in found if pod is None or pod in (f.name, f.pod)]
    if attempt is not None:
        return sorted((f for f in chosen if f.attempt == attempt), key=lambda f: f.name)
    latest: dict[str, PodLog] = {}
    for f in chosen:
        if f.name not in latest or f.attempt > latest[f.name].attempt:
            latest[f.name] = f
    return [latest[n] for n in sorted(latest, key=_pod_order)]


def _pod_order(name: str) -> tuple[str, int]:
    base, _, index = name.rpartition("-")
    return (base, int(index)) if index.isdigit() else (name, -1)


class Printer:
    """Writes chunks; with ``prefix``, whole lines each headed by ``[pod]``."""

    def __init__(self, out: BinaryIO, prefix: bool) -> None:
        self.out, self.prefix = out, prefix

    def write(self, log: PodLog, chunk: bytes, final: bool = False) -> None:
        if not self.prefix:
            self.out.write(chunk)
        else:
            data = log.partial + chunk
            lines = data.split(b"\n")
            log.partial = lines.pop()  # the unfinished last line waits for its end
            if final and log.partial:
                lines.append(log.partial)
                log.partial = b""
            head = f"[{log.name}] ".encode()
            self.out.write(b"".join(head + line + b"\n" for line in lines))
        self.out.flush()


async def find_logs(client: TideClient, job_id: str, nodes: list[str]) -> tuple[list[PodLog], list[str]]:
    """Every log file of the job on ``nodes``, and the nodes that did not answer."""
    async def ask(node: str) -> list[PodLog] | None:
        try:
            body = await client.node_logs(node, {"job_id": job_id}, timeout_s=3.0)
        except NodeNotAnswering:
            return None
        if not body.get("ok"):
            raise LogsError(f"node {node}: {body.get('error', 'refused')}")
        return [PodLog(job_id, node, p["pod"], p["name"], p["attempt"]) for p in body["pods"]]

    answers = await asyncio.gather(*(ask(n) for n in nodes))
    found = [f for a in answers if a for f in a]
    silent = [n for n, a in zip(nodes, answers, strict=True) if a is None]
    return found, silent


async def read_chunk(client: TideClient, log: PodLog, tail: int | None) -> tuple[bytes, bool, bool]:
    """(bytes, whether more is there now, whether the pod still runs); the first read of a tail starts at
    its last ``tail`` lines."""
    req: dict[str, Any] = {"job_id": log.job_id, "pod": log.pod, "offset": log.offset}
    if tail is not None and not log.started:
        req["tail_lines"] = tail
    try:
        body = await client.node_logs(log.node, req, timeout_s=5.0)
    except NodeNotAnswering as exc:
        raise LogsError(f"node {log.node} stopped answering while reading pod {log.name}'s log "
                        "(its agent is down or the node is gone)") from exc
    if not body.get("ok"):
        raise LogsError(f"node {log.node}: {body.get('error', 'refused')}")
    log.started = True
    chunk = base64.b64decode(body["data"])
    log.offset = body["next_offset"]
    return chunk, log.offset < body["size"], bool(body["running"])


async def run(client: TideClient, job_id: str, pod: str | None, follow: bool, attempt: int | None,
              tail: int | None, out: BinaryIO | None = None) -> int:
    out = out or sys.stdout.buffer
    job = await client.job(job_id)
    if job is None:
        raise LogsError(f"no job {job_id!r}")
    if job["state"] == "rejected":
        raise LogsError(f"job {job_id} was rejected ({job['reason']}); it never ran, so it has no logs")
    names = {p["name"] for p in job["pods"]}
    if pod is not None and pod.rpartition(".a")[0] not in names and pod not in names:
        raise LogsError(f"job {job_id} has no pod {pod!r} (pods: {', '.join(sorted(names, key=_pod_order))})")
    while True:
        holders = sorted({p["node"] for p in job["pods"] if p.get("node")})
        try:
            known = [n["node_id"] for n in await client.nodes()]
        except ServiceUnavailable:
            known = []  # the placer is down: the nodes the pods are on still answer
        found, silent = await find_logs(client, job_id, sorted(set(holders) | set(known)))
        chosen = select(found, pod, attempt)
        missing = [n for n in silent if n in holders]
        if chosen or not follow or job["state"] in FINAL_FOR_WAIT:
            break
        await asyncio.sleep(POLL_S * 2)  # -f on a job whose pods have not started yet: wait for them
        job = await client.job(job_id) or job
    if not chosen:
        if missing:
            raise LogsError(f"node {missing[0]} is not answering, so the logs of job {job_id} cannot be read "
                            "(its agent is down or the node is gone)")
        what = f"pod {pod}" if pod else f"job {job_id}"
        which = f" attempt {attempt}" if attempt is not None else ""
        why = f"{job['state']}: {job['reason']}" if job["reason"] else job["state"]
        raise LogsError(f"no logs for {what}{which} (job {why})")
    for node in missing:
        print(f"tide: node {node} is not answering; logs of its pods are missing", file=sys.stderr)
    printer = Printer(out, prefix=len(chosen) > 1)
    if not follow:
        for log in chosen:
            more = True
            while more:
                chunk, more, _ = await read_chunk(client, log, tail)
                printer.write(log, chunk)
                if not chunk:
                    break
            printer.write(log, b"", final=True)
        return 1 if missing else 0
    while not all(log.done for log in chosen):
        idle = True
        for log in chosen:
            if log.done:
                continue
            chunk, more, running = await read_chunk(client, log, tail)
            printer.write(log, chunk)
            idle = idle and not more
            if not running and not more:
                log.done = True
                printer.write(log, b"", final=True)
        if idle:
            await asyncio.sleep(POLL_S)
    return 1 if missing else 0
