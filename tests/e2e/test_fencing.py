"""At most one live attempt per pod: fencing tokens (the job's attempt) on every start, stop and exit.

The pods here leave a witness file (pid, attempt, GPUs) so the tests can see which processes really
run, whatever the control plane believes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import nats
from tide import subjects
from tide.client import TideClient
from tide.schemas.events import NodeRegistered, StartPod
from tide.stack.auth import node_user

from tests.helpers import PY, small_node

SLEEP = "import sys, time; time.sleep(float(sys.argv[1]))"


def witness_job(name: str, witness_dir: Path, replicas: int, gpu: int, sleep_s: float) -> dict:
    return {"metadata": {"name": name}, "spec": {"replicas": replicas, "template": {
        "command": [PY, "-c", SLEEP, str(sleep_s)], "env": {"WITNESS_DIR": str(witness_dir)},
        "resources": {"gpu": gpu}}}}


def live_pods(witness_dir: Path) -> list[dict]:
    """The pods really running (whatever the control plane believes): processes whose environment names
    this test's ``WITNESS_DIR``, one entry per pod attempt."""
    marker = f"WITNESS_DIR={witness_dir}".encode()
    out: dict[tuple[str, int], dict] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            env = dict(e.split(b"=", 1) for e in proc.joinpath("environ").read_bytes().split(b"\0") if b"=" in e)
        except (OSError, IndexError, ValueError):
            continue
        if b"WITNESS_DIR=" + env.get(b"WITNESS_DIR", b"") != marker:
            continue
        pod, attempt = env[b"TIDE_POD_NAME"].decode(), int(env[b"TIDE_ATTEMPT"])
        out[(pod, attempt)] = {"pod": pod, "attempt": attempt, "job": env[b"TIDE_JOB_ID"].decode(),
                               "gpus": env[b"CUDA_VISIBLE_DEVICES"].decode(), "pid": int(proc.name)}
    return list(out.values())


async def until(check, timeout_s: float, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(every_s)


async def test_agent_stalled_during_a_gang_start_runs_no_pod_of_the_old_attempt(make_stack, tmp_path: Path) -> None:
    witness = tmp_path / "witness"
    stack = make_stack([small_node(f"n{i}", gpus=8) for i in range(3)], env={"placer": {
        "TIDE_START_ACK_TIMEOUT_S": "1", "TIDE_FAULT_PAUSE_AFTER_RESERVE_S": "1.5"}})
    client = await TideClient.connect(stack.info.settings_for("admin"))
    stalled = None
    try:
        assert (await client.submit(witness_job("gang", witness, 2, 8, 30), job_id="stall-gang")).accepted

        async def reserved():
            j = await client.job("stall-gang")
            return j if j and j["attempts"] == 1 and all(p["node"] for p in j["pods"]) else None

        first = await until(reserved, 30, 0.02)
        assert first, "attempt 1 was never reserved"
        stalled = first["pods"][1]["node"]
        stack.procs[f"agent-{stalled}"].send_signal(signal.SIGSTOP)  # before the placer sends the starts

        async def second_running():
            j = await client.job("stall-gang")
            return j if j and j["attempts"] >= 2 and j["state"] == "running" else None

        second = await until(second_running, 60, 0.2)
        assert second, await client.job("stall-gang")
        assert stalled not in {p["node"] for p in second["pods"]}
        stack.procs[f"agent-{stalled}"].send_signal(signal.SIGCONT)  # it finds the old start request waiting
        stalled = None

        async def only_current():
            pods = live_pods(witness)
            current = (await client.job("stall-gang"))["attempts"]
            return pods if pods and all(p["attempt"] == current for p in pods) and len(pods) == 2 else None

        await asyncio.sleep(2)  # the resumed agent has had time to run what it found
        pods = await until(only_current, 15, 0.2)
        assert pods, f"pods of an old attempt still run: {live_pods(witness)}"
        gpus = [g for p in pods for g in p["gpus"].split(",")]
        assert len(gpus) == len(set(gpus)) == 16  # no GPU held by two pods
        await client.cancel("stall-gang")
        assert (await client.wait("stall-gang", timeout_s=30))["state"] == "cancelled"
    finally:
        if stalled:
            stack.procs[f"agent-{stalled}"].send_signal(signal.SIGCONT)
        await client.close()


async def test_placer_stops_a_pod_an_agent_runs_that_no_job_holds(make_stack, tmp_path: Path) -> None:
    """Reverse reconciliation: the agent reports its pods on every heartbeat; the placer stops strays."""
    witness = tmp_path / "witness"
    stack = make_stack([small_node("n0", gpus=2)])
    info = stack.info
    nc = await nats.connect(info.nats_url, user="placer", password=info.passwords["placer"],
                            inbox_prefix="_INBOX_placer")
    try:
        ghost = StartPod(job_id="ghost", pod="ghost-0.a1", pod_index=0, world_size=1,
                         command=[PY, "-c", SLEEP, "60"], env={"WITNESS_DIR": str(witness)})
        reply = await nc.request(subjects.node_cmd("n0"), ghost.to_bytes(), timeout=5)
        assert json.loads(reply.data)["ok"]  # the agent ran it (a start without an expiry, as older placers sent)
        started = (stack.home / "agents" / "n0" / "ghost" / "ghost-0.a1.log").exists()
        assert started

        async def gone():
            return not live_pods(witness)

        assert await until(gone, 20), f"the stray pod still runs: {live_pods(witness)}"
    finally:
        await nc.close()
        for p in live_pods(witness):
            os.kill(p["pid"], signal.SIGKILL)


RUN_ONCE = ("import os, sys, time; d = os.environ['RUNS_DIR']; "
            "open(os.path.join(d, f\"{os.environ['TIDE_POD_NAME']}.a{os.environ['TIDE_ATTEMPT']}.{os.getpid()}\"), 'w')"
            ".close(); time.sleep(float(sys.argv[1]))")


async def test_a_pod_whose_start_reply_is_lost_is_settled_not_run_again(make_stack, tmp_path: Path) -> None:
    """The agent starts the pod but its acknowledgement comes after the placer stopped waiting (as when the
    reply is lost with a NATS server). The placer must ask the agent what became of the pod, keep the
    attempt that ran and never start the job again: each pod runs once and the jobs succeed."""
    runs = tmp_path / "runs"
    runs.mkdir()
    stack = make_stack([small_node("n0", gpus=4)], env={"placer": {"TIDE_START_ACK_TIMEOUT_S": "0.02"}})
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        for name, replicas in (("short", 1), ("pair", 2)):
            job = {"metadata": {"name": name}, "spec": {"replicas": replicas, "template": {
                "command": [PY, "-c", RUN_ONCE, "0.3"], "env": {"RUNS_DIR": str(runs)}, "resources": {"gpu": 1}}}}
            assert (await client.submit(job, job_id=name)).accepted
        attempts = {}
        for name in ("short", "pair"):
            done = await client.wait(name, timeout_s=60)
            assert done["state"] == "succeeded", done
            attempts[name] = done["attempts"]  # a start the agent got past its deadline is refused and retried
        await asyncio.sleep(1.5)  # a rerun would have started by now
        ran = sorted(f.name.rsplit(".", 1)[0] for f in runs.iterdir())
        assert ran == [f"pair-0.a{attempts['pair']}", f"pair-1.a{attempts['pair']}",
                       f"short-0.a{attempts['short']}"], ran  # each pod ran once, in the attempt that succeeded
    finally:
        await client.close()


async def test_a_registration_written_before_a_pod_started_does_not_call_it_lost(make_stack, tmp_path: Path) -> None:
    """An agent re-registers when it reconnects; under a JetStream election the message can be handled seconds
    later, after the placer started new pods there. Such a pod is missing from the registration but runs: the
    placer must ask the agent instead of calling it lost and running the job again."""
    runs = tmp_path / "runs"
    runs.mkdir()
    stack = make_stack([small_node("n0", gpus=2)])
    client = await TideClient.connect(stack.info.settings_for("admin"))
    user = node_user("n0")
    agent = await nats.connect(stack.info.nats_url, user=user, password=stack.info.passwords[user],
                               inbox_prefix=subjects.node_inbox_prefix("n0"))
    try:
        job = {"metadata": {"name": "long"}, "spec": {"template": {
            "command": [PY, "-c", RUN_ONCE, "4"], "env": {"RUNS_DIR": str(runs)}, "resources": {"gpu": 1}}}}
        assert (await client.submit(job, job_id="long")).accepted

        async def running():
            j = await client.job("long")
            return j if j and j["state"] == "running" else None

        assert await until(running, 30, 0.1)
        old = NodeRegistered(node=small_node("n0", gpus=2), running_pods=[], exited=[], lease_s=20,
                             fence_grace_s=5, heartbeat_s=2)  # written before the pod started
        await agent.jetstream().publish(subjects.node_status("n0"), old.to_bytes())
        done = await client.wait("long", timeout_s=30)
        assert done["state"] == "succeeded" and done["attempts"] == 1, done
        await asyncio.sleep(1)
        assert [f.name.rsplit(".", 1)[0] for f in runs.iterdir()] == ["long-0.a1"]
    finally:
        await agent.close()
        await client.close()
