"""Bounded chaos: one fault per test under a steady mixed load (tests/chaos/harness.py), on real NATS
JetStream and Redis servers over loopback. After each fault: every job ends, none is lost, no pod ran
twice at once or completed twice, no GPU was held twice at once, no gang ran partially, and nothing is
left reserved or claimed in Redis. Each test prints its figures as one JSON line (run with ``-s``);
docs/reliability.md collects them.

Killed with ``kill -9`` behind the launcher's back, a process is restarted by the launcher's supervisor
after its backoff (0.5 s), as ``tide up`` does in production; the placer killed between reserve and
commit is held down and restarted by hand (without the fault-injection pause).

Three bugs these faults found are fixed and their tests now pass: a job whose pods fenced themselves
while NATS was down stayed running forever (fenced pods now exit as lost, and the job is requeued
whole); a gang that completed while NATS was down ran again (a re-registration carries the agent's
recent exits); a frozen agent's pods ran beside their replacements (each pod's leader fences it when
the agent's lease file is not renewed).
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from tests.chaos.harness import (
    RESERVATION_TTL_S,
    Chaos,
    assert_invariants,
    run_fault,
    sigkill,
    spec,
    until,
)
from tests.ha.conftest import nats_process, server_of_client


def killed_and_restarted(name: str):
    """The inject and recover steps of a kill -9 that the supervisor answers with a restart."""

    async def inject(c: Chaos) -> None:
        c.notes["restarts_before"] = c.stack.restarts(name)
        sigkill(c.stack, name)

    async def recover(c: Chaos) -> None:
        restarted = await until(lambda: _true(c.stack.restarts(name) > c.notes["restarts_before"]), 30, 0.05)
        assert restarted, f"the supervisor did not restart {name}"
        c.notes["restarted_after_s"] = round(time.time() - c.t_fault, 2)
        del c.notes["restarts_before"]
        if name in c.stack.services:  # back once it says it is ready
            ready = c.stack.home / "run" / f"{name}.ready"
            assert await until(lambda: _true(ready.exists()), 30, 0.05), f"{name} restarted but never got ready"
            c.notes["ready_after_s"] = round(time.time() - c.t_fault, 2)

    return inject, recover


async def _true(value: bool) -> bool:
    return value


async def test_queue_killed(make_stack, tmp_path: Path) -> None:
    report = await run_fault(make_stack, tmp_path, "queue kill -9", *killed_and_restarted("queue"))
    assert_invariants(report)


async def test_placer_killed(make_stack, tmp_path: Path) -> None:
    report = await run_fault(make_stack, tmp_path, "placer kill -9", *killed_and_restarted("placer"))
    assert_invariants(report)


async def test_metrics_killed(make_stack, tmp_path: Path) -> None:
    report = await run_fault(make_stack, tmp_path, "metrics kill -9", *killed_and_restarted("metrics"))
    assert_invariants(report)


async def test_redis_killed(make_stack, tmp_path: Path) -> None:
    report = await run_fault(make_stack, tmp_path, "redis kill -9", *killed_and_restarted("redis"))
    assert_invariants(report)


async def test_nats_killed(make_stack, tmp_path: Path) -> None:
    report = await run_fault(make_stack, tmp_path, "nats kill -9", *killed_and_restarted("nats"))
    assert_invariants(report)


async def test_placer_killed_between_reserve_and_commit_of_the_16_pod_gang(make_stack, tmp_path: Path) -> None:
    """The placer stalls after reserving each gang (TIDE_FAULT_PAUSE_AFTER_RESERVE_S); it is killed while the
    16-pod gang is reserved and none of its pods started, kept down past the reservation TTL, and restarted
    without the pause."""

    async def reserved(c: Chaos) -> object:
        j = await c.client.job("gang16")
        return j if j and j["attempts"] == 1 and all(p["node"] for p in j["pods"]) and j["state"] != "running" \
            else None

    async def inject(c: Chaos) -> None:
        c.stack.kill("placer", signal.SIGKILL)

    async def recover(c: Chaos) -> None:
        await until(lambda: _true(time.time() - c.t_fault > RESERVATION_TTL_S + 0.5), 30, 0.1)
        c.stack.restart("placer", env={"TIDE_FAULT_PAUSE_AFTER_RESERVE_S": "0"})
        c.notes["down_s"] = round(time.time() - c.t_fault, 2)

    report = await run_fault(make_stack, tmp_path, "placer kill -9 between reserve and commit (16-pod gang)",
                             inject, recover, trigger=reserved, placer_env={"TIDE_FAULT_PAUSE_AFTER_RESERVE_S": "2"})
    first_attempt = [r for r in report["records"] if r.job == "gang16" and r.attempt == 1]
    assert not first_attempt, f"pods of the reserved, never committed attempt ran: {[r.file for r in first_attempt]}"
    assert_invariants(report)


async def test_node_agent_killed(make_stack, tmp_path: Path) -> None:
    """kill -9 of the agent on a node running part of the 16-pod gang: its pods die with it (pod leaders),
    the supervisor restarts it; the gang is requeued whole and every job still succeeds."""
    box: dict[str, str] = {}

    async def inject(c: Chaos) -> None:
        box["name"] = f"agent-{c.victim}"
        c.notes["node"] = c.victim
        c.notes["restarts_before"] = c.stack.restarts(box["name"])
        sigkill(c.stack, box["name"])

    async def recover(c: Chaos) -> None:
        await killed_and_restarted(box["name"])[1](c)
        c.notes["silent"] = (c.victim, c.t_fault, time.time())  # what its pods did in between, nobody heard

    report = await run_fault(make_stack, tmp_path, "node agent kill -9", inject, recover)
    assert_invariants(report)


async def test_node_agent_paused_past_its_lease(make_stack, tmp_path: Path) -> None:
    """SIGSTOP of the agent on a node running part of a long 16-pod gang, until the node is declared lost
    and the gang runs again elsewhere, then SIGCONT: the pods the frozen agent had started keep running
    meanwhile (only the agent process is stopped), so the replacement must not start while they live."""

    async def inject(c: Chaos) -> None:
        c.notes["node"] = c.victim
        c.stack.procs[f"agent-{c.victim}"].send_signal(signal.SIGSTOP)

    async def recover(c: Chaos) -> None:
        try:
            async def moved() -> object:
                j = await c.client.job("gang16")
                return j if j and j["attempts"] >= 2 and j["state"] == "running" else None

            await until(moved, 30, 0.1)
            await until(lambda: _true(time.time() - c.t_fault > 6), 10, 0.1)  # past lease + loss window
        finally:
            c.stack.procs[f"agent-{c.victim}"].send_signal(signal.SIGCONT)
            c.notes["paused_s"] = round(time.time() - c.t_fault, 2)
            c.notes["silent"] = (c.victim, c.t_fault, time.time())

    report = await run_fault(make_stack, tmp_path, "node agent SIGSTOP past its lease, then SIGCONT", inject,
                             recover, gang_s=12.0, gang_later_s=2.5)
    assert_invariants(report)


def _running(c: Chaos, job_ids: list[str]) -> bool:
    names = [f.name for f in c.witness.iterdir()]
    return all(any(n.startswith(f"{j}-0.a1.") for n in names) for j in job_ids)


async def test_nats_down_past_the_agents_lease(make_stack, tmp_path: Path) -> None:
    """NATS killed and kept down 2.5 s, past the agents' 2 s lease, while 8 single-pod jobs run: every agent
    fences itself (stops its pods). The placer, deaf too, declares no node lost; the fenced pods' jobs must
    run again and succeed."""
    witness = tmp_path / "witness"
    jobs = {f"fenced{i}": spec(f"fenced{i}", witness, 8.0, later_s=0.3, gpu=1) for i in range(8)}

    async def all_running(c: Chaos) -> bool:
        return _running(c, list(jobs))

    async def inject(c: Chaos) -> None:
        c.stack.kill("nats", signal.SIGKILL)

    async def recover(c: Chaos) -> None:
        await until(lambda: _true(time.time() - c.t_fault > 2.5), 5, 0.05)
        c.stack.restart("nats")
        c.notes["down_s"] = round(time.time() - c.t_fault, 2)

    report = await run_fault(make_stack, tmp_path, "nats kill -9, down 2.5 s (past the agents' lease)", inject,
                             recover, trigger=all_running, jobs=jobs, settle_s=15)
    assert_invariants(report)


async def test_gangs_completing_while_nats_is_down_are_not_run_again(make_stack, tmp_path: Path) -> None:
    """NATS killed (kill -9) while two 8-pod gangs run; their pods complete while it is down; NATS is
    restarted once they have, every agent re-registers, and the placer reads the exits and the
    re-registrations together. No gang that completed may run again."""
    witness = tmp_path / "witness"
    jobs = {f"done{i}": spec(f"done{i}", witness, 1.2, replicas=8, gpu=1) for i in range(2)}

    async def all_running(c: Chaos) -> bool:
        names = [f.name for f in c.witness.iterdir()]
        return all(any(n.startswith(f"{j}-{k}.a1.") for n in names) for j in jobs for k in range(8))

    async def inject(c: Chaos) -> None:
        c.stack.kill("nats", signal.SIGKILL)

    async def recover(c: Chaos) -> None:
        def completed() -> bool:
            files = [f for f in c.witness.iterdir() if ".a1." in f.name]
            return len(files) == 16 and all("\ne " in f.read_text() for f in files)

        assert await until(lambda: _true(completed()), 10, 0.05), "the pods did not complete"
        c.stack.restart("nats")
        c.notes["down_s"] = round(time.time() - c.t_fault, 2)

    report = await run_fault(make_stack, tmp_path, "nats kill -9 while two 8-pod gangs complete", inject, recover,
                             trigger=all_running, jobs=jobs)
    assert_invariants(report)


# ---------------------------------------------------------------- the same faults on the HA set-up (docs/ha.md)
async def test_ha_redis_primary_killed_and_kept_down(make_stack, tmp_path: Path) -> None:
    """HA: the Valkey primary killed and kept down (no restart): a Sentinel promotes the replica and the
    services follow it; the checks read Redis through the Sentinels too."""

    async def inject(c: Chaos) -> None:
        c.stack.kill("redis", signal.SIGKILL)  # on purpose: the supervisor leaves it down

    report = await run_fault(make_stack, tmp_path, "HA: redis primary kill -9 (Sentinel failover)", inject,
                             ha=True)
    assert_invariants(report)


async def test_ha_nats_server_of_the_placer_killed(make_stack, tmp_path: Path) -> None:
    """HA: the NATS server the placer is connected to killed, restarted 3 s later; the placer and agents
    reconnect to the other servers and the streams (3 replicas) elect new leaders."""

    async def inject(c: Chaos) -> None:
        c.notes["server"] = server_of_client(c.stack, "tide-placer")
        c.stack.kill(c.notes["server"], signal.SIGKILL)

    async def recover(c: Chaos) -> None:
        await until(lambda: _true(time.time() - c.t_fault > 3), 5, 0.05)
        c.stack.restart(c.notes["server"])

    # a reservation must outlive JetStream's leader election (4-9 s here, docs/ha.md): the pods' start
    # reports wait for it, and a reservation lapsing meanwhile reruns pods that did start (the default is 30 s)
    report = await run_fault(make_stack, tmp_path, "HA: the placer's NATS server kill -9, back after 3 s", inject,
                             recover, ha=True, placer_env={"TIDE_RESERVATION_TTL_S": "20"})
    assert_invariants(report)


@pytest.mark.parametrize("service", ["queue", "placer", "metrics"])
async def test_ha_service_killed(make_stack, tmp_path: Path, service: str) -> None:
    """HA: the same kill -9 of a service as on one server (the supervisor restarts it); the services
    reach NATS and Redis through the cluster and the Sentinels."""
    report = await run_fault(make_stack, tmp_path, f"HA: {service} kill -9", *killed_and_restarted(service), ha=True)
    assert_invariants(report)


def jetstream_meta_leader(stack) -> str:
    """The NATS server process that leads the JetStream meta group, from a server's /jsz."""
    for process, port in stack.info.monitor_ports.items():
        if process in stack.held:
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/jsz", timeout=2) as reply:
            leader = json.loads(reply.read()).get("meta_cluster", {}).get("leader")
        if leader:
            return nats_process(leader)
    raise AssertionError("no JetStream meta leader")


async def test_ha_jetstream_meta_leader_killed(make_stack, tmp_path: Path) -> None:
    """HA: the NATS server leading the JetStream meta group killed, restarted 3 s later."""

    async def inject(c: Chaos) -> None:
        c.notes["server"] = jetstream_meta_leader(c.stack)
        c.stack.kill(c.notes["server"], signal.SIGKILL)

    async def recover(c: Chaos) -> None:
        await until(lambda: _true(time.time() - c.t_fault > 3), 5, 0.05)
        c.stack.restart(c.notes["server"])

    report = await run_fault(make_stack, tmp_path, "HA: the JetStream meta leader kill -9, back after 3 s", inject,
                             recover, ha=True, placer_env={"TIDE_RESERVATION_TTL_S": "20"})
    assert_invariants(report)
