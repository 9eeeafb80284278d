"""Placer failover on real servers: two placers, one leader lease (docs/ha.md, "Placer failover").

``pytest tests/ha/test_placer_leader.py -s`` prints the measured takeover times."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from redis.asyncio import Redis
from tide.client import TideClient
from tide.schemas.events import JobRecord
from tide.stack.launcher import Stack
from tide.store import keys

from tests.conftest import StackFactory
from tests.ha.conftest import record
from tests.helpers import job, small_node

TTL_S = 5.0  # the defaults: TIDE_PLACER_LEASE_TTL_S, TIDE_PLACER_LEASE_RENEW_S
RENEW_S = 1.0
SLACK_S = 2.0  # two shared CPU cores: a standby's renewal tick may run late


def marker_pod(out: Path, seconds: float) -> list[str]:
    """A pod that notes its start and, when it ran to the end, its completion (ground truth for 'exactly once')."""
    return ["sh", "-c", f'echo start >> {out}/$TIDE_JOB_ID.starts; sleep {seconds}; echo done >> {out}/$TIDE_JOB_ID']


def leader_process(stack: Stack, token: str) -> str:
    """``placer@host:<pid>:<hex>`` -> the stack's process name with that pid."""
    pid = int(token.split("@", 1)[1].split(":")[1])
    return next(name for name, proc in stack.procs.items() if proc.pid == pid)


async def wait_leader(redis: Redis, other_than: str | None, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        token = await redis.get(keys.PLACER_LEADER)
        if token and token != other_than:
            return str(token)
        assert time.monotonic() < deadline, f"no new placer leader after {timeout_s}s (still {token})"
        await asyncio.sleep(0.02)


def log_events(stack: Stack, name: str, offset: int = 0) -> list[dict]:
    text = (Path(stack.home) / "logs" / f"{name}.log").read_bytes()[offset:].decode(errors="replace")
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def make_two_placers(make_stack: StackFactory, **env: str) -> Stack:
    placer_env = {"TIDE_RESERVATION_TTL_S": "8", **env}
    return make_stack([small_node(f"n{i}", gpus=4) for i in range(3)], placers=2,
                      env={"placer": placer_env, "placer-2": placer_env})


async def test_kill_leader_under_load_standby_takes_over(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_two_placers(make_stack)
    info = stack.info
    assert info is not None
    out = tmp_path / "done"
    out.mkdir()
    redis = Redis.from_url(info.redis_url("placer"), decode_responses=True)
    client = await TideClient.connect(info.settings_for("admin"))
    try:
        old = await wait_leader(redis, None, 10)
        leader = leader_process(stack, old)
        standby = "placer-2" if leader == "placer" else "placer"
        ids = [f"load-{i}" for i in range(48)]

        async def submit_all() -> None:
            for job_id in ids:
                assert (await client.submit(job("load", marker_pod(out, 0.8), gpu=1), job_id=job_id)).accepted
                await asyncio.sleep(0.1)

        submitting = asyncio.create_task(submit_all())
        await asyncio.sleep(2.0)  # jobs pending, reserved, running and finished: steady load
        killed_at = time.monotonic()
        stack.kill(leader, signal.SIGKILL)
        new = await wait_leader(redis, old, TTL_S + RENEW_S + SLACK_S + 5)
        takeover = time.monotonic() - killed_at
        assert leader_process(stack, new) == standby
        record("placer leader kill -9 -> standby holds the lease", takeover)
        assert takeover <= TTL_S + RENEW_S + SLACK_S
        await submitting
        assert (await client.submit(job("probe", marker_pod(out, 0.1), gpu=1), job_id="probe")).accepted
        probe = await client.wait("probe", timeout_s=90)
        assert probe["state"] == "succeeded"
        record("placer leader kill -9 -> a job submitted after the load succeeded (from the kill)",
               time.monotonic() - killed_at)
        results = [await client.wait(j, timeout_s=120) for j in ids]
        record("placer leader kill -9 -> all 48 jobs of the load succeeded", time.monotonic() - killed_at)
    finally:
        await client.close()
    assert [r["state"] for r in results] == ["succeeded"] * len(ids)
    done = {j: (out / j).read_text().split() for j in ids}
    assert all(lines == ["done"] for lines in done.values()), {j: n for j, n in done.items() if n != ["done"]}
    restarted = sorted(j for j in ids if len((out / f"{j}.starts").read_text().split()) > 1)
    print(f"\njobs started more than once (an attempt rolled back, not completed twice): {restarted}")
    deadline = time.monotonic() + 30
    while await redis.scard(keys.CLAIMS_INDEX) or await redis.zcard(keys.RESERVATIONS):
        assert time.monotonic() < deadline, "claims or reservations left after every job ended"
        await asyncio.sleep(0.2)
    acquired = [e for e in log_events(stack, standby) if e.get("event") == "placer_leader_acquired"]
    assert [e["token"] for e in acquired] == [new]
    await redis.aclose()


async def test_sigstopped_leader_resumed_after_takeover_writes_nothing_and_steps_down(
        make_stack: StackFactory, tmp_path: Path) -> None:
    # every bind pauses between reserve and start, so the leader can be stopped holding a reservation
    stack = make_two_placers(make_stack, TIDE_FAULT_PAUSE_AFTER_RESERVE_S="2")
    info = stack.info
    assert info is not None
    out = tmp_path / "done"
    out.mkdir()
    redis = Redis.from_url(info.redis_url("placer"), decode_responses=True)
    client = await TideClient.connect(info.settings_for("admin"))
    try:
        old = await wait_leader(redis, None, 10)
        leader = leader_process(stack, old)
        standby = "placer-2" if leader == "placer" else "placer"
        pid = stack.procs[leader].pid
        assert (await client.submit(job("x", marker_pod(out, 0.5), gpu=1), job_id="x")).accepted
        deadline = time.monotonic() + 20
        while True:  # the leader reserved x and sleeps before starting it
            raw = await redis.get(keys.job("x"))
            if raw and JobRecord.model_validate_json(raw).reservation:
                break
            assert time.monotonic() < deadline, "x was never reserved"
            await asyncio.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        offset = (Path(stack.home) / "logs" / f"{leader}.log").stat().st_size
        new = await wait_leader(redis, old, TTL_S + RENEW_S + SLACK_S + 5)
        record("placer leader SIGSTOP -> standby holds the lease", time.monotonic() - stopped_at)
        assert leader_process(stack, new) == standby
        os.kill(pid, signal.SIGCONT)
        assert (await client.submit(job("y", marker_pod(out, 0.2), gpu=1), job_id="y")).accepted
        x = await client.wait("x", timeout_s=90)
        y = await client.wait("y", timeout_s=90)
        await asyncio.sleep(2 * RENEW_S)
        assert stack.procs[leader].poll() is None, "the old leader should live on as a standby"
        assert await redis.get(keys.PLACER_LEADER) == new
    finally:
        await client.close()
        if stack.procs[leader].poll() is None:
            os.kill(pid, signal.SIGCONT)
    assert (x["state"], y["state"]) == ("succeeded", "succeeded")
    assert (out / "x").read_text().split() == ["done"]
    events = log_events(stack, leader, offset)
    names = [e.get("event") for e in events]
    print(f"\nthe old leader after SIGCONT: {names}")
    lost = [e for e in events if e.get("event") == "placer_leader_lost"]
    assert [e["token"] for e in lost] == [old], lost
    # nothing reserved, committed, adopted, started or finished by the old leader after the takeover
    acted = {"job_reserved", "gang_committed", "reservation_adopted", "job_running", "job_finished", "job_rollback",
             "node_registered", "placer_leader_acquired"}
    assert not acted & set(names), acted & set(names)
    new_events = {e.get("event") for e in log_events(stack, standby)}
    assert "placer_leader_acquired" in new_events
    # a clean shutdown of the new leader gives the lease up: the old one, a standby now, leads again at once
    stopped_at = time.monotonic()
    stack.kill(standby, signal.SIGTERM, timeout_s=30)
    again = await wait_leader(redis, new, RENEW_S + SLACK_S + 5)
    record("placer leader SIGTERM (lease released) -> standby holds the lease", time.monotonic() - stopped_at)
    assert leader_process(stack, again) == leader
    client = await TideClient.connect(info.settings_for("admin"))
    try:
        assert (await client.submit(job("z", marker_pod(out, 0.1), gpu=1), job_id="z")).accepted
        assert (await client.wait("z", timeout_s=60))["state"] == "succeeded"
    finally:
        await client.close()
    assert any(e.get("event") == "placer_leader_released" for e in log_events(stack, standby))
    await redis.aclose()
