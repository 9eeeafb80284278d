"""Shared by the poison-message and fuzz tests: speak as any user of a live stack, read its dead letters, check
that no process of the stack exited and that a normal job still runs."""

from __future__ import annotations

import asyncio

import nats
from nats.aio.client import Client as NATS
from nats.js.api import DeliverPolicy
from tide import subjects
from tide.bus.dead_letters import DeadLetter
from tide.client import TideClient
from tide.schemas.events import NodeRegistered
from tide.schemas.node import GpuDescription, MigInstanceDescription, NodeDescription
from tide.stack.launcher import Stack

from tests.helpers import job

INBOXES = {"queue": "_INBOX_queue", "placer": "_INBOX_placer", "metrics": "_INBOX_metrics"}


async def connect_as(stack: Stack, user: str) -> NATS:
    """A connection as ``user`` (a service, ``admin``, ``node-<id>`` or a tenant), with that user's inbox."""
    info = stack.info
    assert info is not None
    if user.startswith("node-"):
        inbox = subjects.node_inbox_prefix(user.removeprefix("node-"))
    else:
        inbox = INBOXES.get(user, "_INBOX" if user == "admin" else f"_INBOX_{user}")

    async def quiet(exc: Exception) -> None:
        pass

    return await nats.connect(info.nats_url, user=user, password=info.passwords[user], inbox_prefix=inbox,
                              error_cb=quiet, max_reconnect_attempts=0)


def pids(stack: Stack) -> dict[str, int]:
    return {name: proc.pid for name, proc in stack.procs.items()}


def assert_all_alive(stack: Stack, before: dict[str, int]) -> None:
    """Every process of the stack still runs, as the very process it was (same pid, never restarted)."""
    problems = []
    for name, pid in before.items():
        proc = stack.procs[name]
        if proc.pid != pid or proc.poll() is not None or stack.restarts(name):
            problems.append(f"{name}: pid {pid} -> {proc.pid}, exit {proc.poll()}, restarts {stack.restarts(name)}")
    assert not problems, "; ".join(problems)


async def dead_letters(stack: Stack, filter_subject: str = subjects.DLQ_ALL) -> list[tuple[DeadLetter, bytes]]:
    """Every dead letter kept in the DLQ stream (read as admin), with its body."""
    nc = await connect_as(stack, "admin")
    js = nc.jetstream()
    try:
        info = await js.stream_info("DLQ")
        if info.state.messages == 0:
            return []
        sub = await js.subscribe(filter_subject, stream="DLQ", ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        out: list[tuple[DeadLetter, bytes]] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):
                break
            letter = DeadLetter.from_headers(msg.headers)
            assert letter is not None, msg.headers
            out.append((letter, msg.data))
            if msg.metadata.num_pending == 0:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def wait_dead_letter(stack: Stack, consumer: str, timeout_s: float = 30.0) -> list[tuple[DeadLetter, bytes]]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = [(d, b) for d, b in await dead_letters(stack) if d.consumer == consumer]
        if found or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.5)


async def normal_job_succeeds(client: TideClient, job_id: str, timeout_s: float = 60.0) -> dict:
    result = await client.submit(job("normal", ["true"], gpu=1), job_id=job_id)
    assert result.accepted, result
    return await client.wait(job_id, timeout_s=timeout_s)


ODD = "ünï\u200bcødé \U0001f680 \u202e \x00 ☃"


def hostile_specs() -> dict[str, dict]:
    """Valid for the queue, extreme for everything after it."""
    huge_gang = job("huge-gang", ["true"], replicas=4096, gpu=16)  # never fits: unschedulable
    elastic = job("elastic-4096", ["true"], replicas=4096, gpu=1)
    elastic["spec"]["minMember"] = 1  # one pod is the gang; 4,095 elastic extras want every GPU there is
    odd = job("odd-unicode", ["true"], gpu=1, gpuModel=[ODD, "A100-80GB"])
    odd["metadata"]["labels"] = {ODD: ODD * 50, "k": "\n" * 10}
    odd["spec"]["template"]["env"] = {f"V{i}{ODD}": ODD for i in range(50)}
    odd["spec"]["template"]["nodeSelector"] = {}
    deep_queue = job("deep-queue", ["true"], gpu=1)
    deep_queue["metadata"]["queue"] = "/".join(["q"] * 60)
    maxed = job("maxed", ["true"], cpuMilli=10_000_000, memoryMiB=64 * 1024 * 1024, gpu=16)
    maxed["spec"].update(gracePeriodSeconds=3600, runtimeSeconds=90 * 24 * 3600, gangTimeoutSeconds=1,
                         onTimeout="shrink", topology={"require": "nvlink", "prefer": "nvlink"})
    share = job("full-share", ["true"], gpuShare={"memoryMiB": 1024 * 1024, "smPercent": 100})
    mig = job("mig-nowhere", ["true"], mig="7g.80gb")
    selector = job("selector-nowhere", ["true"], gpu=1)
    selector["spec"]["template"]["nodeSelector"] = {ODD: ODD}
    return {s["metadata"]["name"]: s for s in (huge_gang, elastic, odd, deep_queue, maxed, share, mig, selector)}


def bad_registration() -> bytes:
    """What a node agent may send (its own node id), but whose inventory the planner cannot build: a MIG
    instance its GPU model has no profile for, pods that do not exist, nonsense lease times."""
    node = NodeDescription(node_id="n0", cpu_milli=1, memory_mib=1, gpus=[
        GpuDescription(index=0, model="X", memory_mib=1, mig_capable=True, mig_enabled=True,
                       mig_instances=[MigInstanceDescription(profile="99g.1gb", start=7)]),
        GpuDescription(index=1, model="A100-80GB", memory_mib=81920, nvlink_peers=[5], topology={9: "warp"}),
    ])
    reg = NodeRegistered(node=node, running_pods=["nojob/nopod.a1", "garbage", "/"], lease_s=-1.0,
                         fence_grace_s=1e308, heartbeat_s=0.0)
    return reg.to_bytes()
