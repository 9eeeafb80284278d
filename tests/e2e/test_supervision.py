"""`tide up` supervises what it starts: a crashed process comes back (with backoff), health.json and
`tide health` show it, the restart count is a Prometheus metric, and `tide down` leaves nothing running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from tide.client import TideClient
from tide.stack.launcher import Stack, StackInfo, marked_pids, pid_alive
from tide.stack.supervision import (
    BACKOFF_CAP_S,
    ProcessHealth,
    backoff_s,
    crashes_in_a_row,
    health_document,
    health_rows,
)

from tests.helpers import job, py

TIDE = str(Path(sys.executable).parent / "tide")


def tide(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    return subprocess.run([TIDE, "--home", str(home), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def wait_until(check: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout_s}s: {what}")
        time.sleep(0.1)


# ---------------------------------------------------------------- pure decisions
def test_backoff_doubles_from_half_a_second_to_thirty() -> None:
    assert [backoff_s(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert backoff_s(1000) == BACKOFF_CAP_S
    assert backoff_s(0) == 0.0


def test_a_minute_of_uptime_resets_the_backoff() -> None:
    assert crashes_in_a_row(0, uptime_s=1) == 1
    assert crashes_in_a_row(3, uptime_s=59.9) == 4
    assert crashes_in_a_row(6, uptime_s=60) == 1


def test_health_rows_say_down_for_a_dead_pid_or_a_stale_file() -> None:
    procs = [ProcessHealth("queue", 11, "running", 100.0, restarts=2, last_exit=-9),
             ProcessHealth("placer", 12, "running", 100.0)]
    doc = health_document(procs, supervisor_pid=1, now=160.0)
    rows, healthy = health_rows(doc, {11: True, 12: True}, now=161.0)
    assert healthy and [(r.name, r.state, r.restarts, round(r.uptime_s or 0)) for r in rows] == [
        ("queue", "running", 2, 61), ("placer", "running", 0, 61)]
    rows, healthy = health_rows(doc, {11: True, 12: False}, now=161.0)
    assert not healthy and rows[1].state == "down"
    rows, healthy = health_rows(doc, {11: True, 12: True}, now=200.0)
    assert not healthy and {r.state for r in rows} == {"unsupervised"}


# ---------------------------------------------------------------- a whole stack
def restarts_metric(metrics_url: str, process: str) -> float | None:
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith("tide_process_restarts_total{") and f'process="{process}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_killed_placer_and_agent_come_back_and_down_leaves_nothing(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack()
    assert stack.info is not None
    home = stack.home
    before = {name: p.pid for name, p in stack.procs.items()}
    nats_env = Path(f"/proc/{before['nats']}/environ").read_bytes().split(b"\0")
    assert b"GOMAXPROCS=1" in nats_env  # NATS on one Go thread beside the services (tide.stack.servers)
    os.kill(before["placer"], signal.SIGKILL)  # crashes the supervisor did not cause
    os.kill(before["agent-node-1"], signal.SIGKILL)
    wait_until(lambda: stack.restarts("placer") == 1 and stack.restarts("agent-node-1") == 1, 30, "restarted")
    after = {name: p.pid for name, p in stack.procs.items()}
    assert after["placer"] != before["placer"] and after["agent-node-1"] != before["agent-node-1"]
    assert all(pid_alive(pid) for pid in after.values())

    def health_shows_restarts() -> bool:
        doc = json.loads((home / "health.json").read_text())
        by_name = {p["name"]: p for p in doc["processes"]}
        return all(by_name[n]["restarts"] == 1 and by_name[n]["state"] == "running" and by_name[n]["pid"] == after[n]
                   for n in ("placer", "agent-node-1")) and by_name["queue"]["restarts"] == 0

    wait_until(health_shows_restarts, 10, "health.json shows the restarts")
    assert StackInfo.load(home).pids["placer"] == after["placer"]  # stack.json follows the restart
    health = tide(home, "health")
    assert health.returncode == 0, health.stdout + health.stderr
    rows = {line.split()[0]: line.split() for line in health.stdout.splitlines()[1:]}
    assert rows["placer"][1] == "running" and rows["placer"][4] == "1" and rows["placer"][5] == "-9"
    assert rows["queue"][4] == "0" and set(rows) >= {"nats", "redis", "queue", "placer", "metrics", "agent-node-0"}

    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        result = await client.submit(job("after-crash", py("pass"), replicas=2, gpu=8), job_id="after-crash")
        assert result.accepted
        done = await client.wait("after-crash", timeout_s=60)
        assert done["state"] == "succeeded" and {p["node"] for p in done["pods"]} == {"node-0", "node-1"}
    finally:
        await client.close()
    wait_until(lambda: restarts_metric(stack.info.metrics_url, "placer") == 1, 15, "metric")
    assert restarts_metric(stack.info.metrics_url, "queue") == 0

    down = tide(home, "down")
    assert down.returncode == 0, down.stderr
    assert "placer" in down.stdout and "nats" in down.stdout and "redis" in down.stdout
    every = {*before.values(), *after.values()}
    wait_until(lambda: not any(pid_alive(pid) for pid in every), 10, "every pid gone")
    time.sleep(1)  # the supervisor restarts nothing after `tide down`
    assert not any(pid_alive(pid) for pid in every) and marked_pids(home) == []
    assert not (home / "stack.json").exists() and tide(home, "health").returncode == 1


@pytest.mark.timeout(240)
def test_detached_stack_is_supervised_and_down_stops_restarted_processes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = tide(home, "up", "--nodes", "1", "--detach", timeout=180)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        info = StackInfo.load(home)
        assert info.supervisor_pid and pid_alive(info.supervisor_pid)
        first = dict(info.pids)
        os.kill(first["placer"], signal.SIGKILL)
        wait_until(lambda: StackInfo.load(home).pids["placer"] != first["placer"], 30, "placer restarted")
        wait_until(lambda: tide(home, "health").returncode == 0, 30, "healthy again")
        assert "placer" in tide(home, "status", "--services").stdout
        nodes = tide(home, "nodes", "--json")
        assert nodes.returncode == 0 and len(json.loads(nodes.stdout)) == 1
        restarted = dict(StackInfo.load(home).pids)
    finally:
        down = tide(home, "down")
    assert down.returncode == 0, down.stderr
    assert "supervisor" in down.stdout and "placer" in down.stdout
    every = {info.supervisor_pid, *first.values(), *restarted.values()}
    wait_until(lambda: not any(pid_alive(pid) for pid in every), 10, "every pid gone")
    assert marked_pids(home) == []
    again = tide(home, "down")
    assert again.returncode == 1 and "no stack running" in again.stderr
