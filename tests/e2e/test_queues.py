"""Queues on real NATS and Redis: borrowing and reclaim, priority preemption, graceful stops."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tide import subjects
from tide.client import TideClient
from tide.schemas.events import JobEvent

from tests.helpers import job, small_node

FAST_PREEMPTION = {"placer": {"TIDE_MIN_RUNTIME_S": "0"}}


def queue_file(tmp_path: Path) -> Path:
    path = tmp_path / "queues.yaml"
    path.write_text(
        "queues:\n"
        "  - {name: team-a, weight: 1, guarantee: {gpu: 8}}\n"
        "  - {name: team-b, weight: 1, guarantee: {gpu: 8}}\n"
        "priorityClasses: {offline-training: {preemptionDelay: 0}}\n"  # reclaim at once (default: after 30 s)
    )
    return path


def in_queue(spec: dict, queue: str, priority: str = "offline-training", grace: float = 1.0) -> dict:
    spec["metadata"]["queue"] = queue
    spec["metadata"]["priorityClass"] = priority
    spec["spec"]["gracePeriodSeconds"] = grace
    return spec


async def states(client: TideClient, ids: list[str]) -> list[str]:
    return [(await client.job(j))["state"] for j in ids]


async def test_idle_guarantee_is_lent_then_reclaimed_from_the_borrowers(make_stack, tmp_path: Path) -> None:
    env = {**FAST_PREEMPTION, "queue": {"TIDE_QUEUE_CONFIG": str(queue_file(tmp_path))}}
    stack = make_stack([small_node("n0", gpus=8), small_node("n1", gpus=8)], env=env)
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        a_jobs = [f"a-{i}" for i in range(16)]
        for j in a_jobs:
            assert (await client.submit(in_queue(job("a", ["sleep", "300"], gpu=1), "team-a"), job_id=j)).accepted
        for j in a_jobs:  # team-b is idle: team-a borrows all 16
            await client.wait(j, states={"running"}, timeout_s=60)
        b_jobs = [f"b-{i}" for i in range(8)]
        submitted = time.time()
        for j in b_jobs:
            assert (await client.submit(in_queue(job("b", ["sleep", "300"], gpu=1), "team-b"), job_id=j)).accepted
        for j in b_jobs:
            await client.wait(j, states={"running"}, timeout_s=30)
        elapsed = time.time() - submitted
        assert elapsed < 1.0 + 6.0, elapsed  # one round plus the victims' 1 s grace (and slack for a busy CI)
        a_states = await states(client, a_jobs)
        assert a_states.count("running") == 8
        assert a_states.count("pending") + a_states.count("preempted") == 8  # requeued, not failed
        queues = await client.queues()
        assert queues["team-a"]["gpus_in_use"] == 8 and queues["team-b"]["gpus_in_use"] == 8
        for j in a_jobs:  # the borrowers are the victims, and each is back in the queue
            record = (await client.status(j))["jobs"][0]
            if record["state"] != "running":
                assert record["preemptions"] == 1 and record["preempted_by"].startswith("b-")
    finally:
        await client.close()


def sigterm_pod(out: Path) -> list[str]:
    """Runs until SIGTERM (noting it), or finishes quickly once it has been preempted before."""
    return ["sh", "-c",
            f'if [ "$TIDE_PREEMPTIONS" -ge 1 ]; then echo resumed >> {out}/$TIDE_POD_NAME; sleep 0.5; exit 0; fi; '
            f'trap "echo TERM >> {out}/$TIDE_POD_NAME; exit 0" TERM; echo ready >> {out}/$TIDE_POD_NAME; '
            f'while true; do sleep 0.1; done']


async def trapping(out: Path, pods: list[str], timeout_s: float = 30.0) -> None:
    """Wait until these sigterm_pod pods have set their SIGTERM trap (running means started, not trapped)."""
    deadline = time.monotonic() + timeout_s
    while not all((out / p).exists() and "ready" in (out / p).read_text() for p in pods):
        assert time.monotonic() < deadline, f"pods not ready: {pods}"
        await asyncio.sleep(0.05)


async def test_online_serving_preempts_exactly_the_minimal_whole_gang(make_stack, tmp_path: Path) -> None:
    stack = make_stack([small_node("n0", gpus=8), small_node("n1", gpus=8)], env=FAST_PREEMPTION)
    out = tmp_path / "marks"
    out.mkdir()
    client = await TideClient.connect(stack.info.settings_for("admin"))
    events: list[JobEvent] = []

    async def on(msg) -> None:
        events.append(JobEvent.model_validate_json(msg.data))

    sub = await client.nc.subscribe(subjects.JOB_EVENTS_ALL, cb=on)
    try:
        gangs = {"big": (2, 4), "mid": (2, 2), "late": (2, 2)}
        for name, (pods, gpus) in gangs.items():
            assert (await client.submit(job(name, sigterm_pod(out), replicas=pods, gpu=gpus), job_id=name)).accepted
            await client.wait(name, states={"running"}, timeout_s=30)
            await trapping(out, [f"{name}-{i}" for i in range(pods)])
        serving = in_queue(job("serve", ["sleep", "2"], gpu=4), "default", priority="online-serving")
        assert (await client.submit(serving, job_id="serve")).accepted
        done = await client.wait("serve", timeout_s=60)
        assert done["state"] == "succeeded"
        preempted = sorted({e.job_id for e in events if e.kind == "preempted"})
        assert preempted == ["late"]  # 4 GPUs for 4 needed (not the 8-GPU gang), and the least work lost
        assert {e.job_id for e in events if e.kind == "checkpoint"} == {"late"}
        terms = sorted(p.name for p in out.iterdir() if "TERM" in p.read_text())
        assert terms == ["late-0", "late-1"]  # the whole gang got SIGTERM, nobody else
        resumed = await client.wait("late", timeout_s=60)  # requeued at its position, then resumed
        assert resumed["state"] == "succeeded" and resumed["attempts"] == 2
        assert all("resumed" in (out / p).read_text() for p in ("late-0", "late-1"))
        assert (await client.job("big"))["state"] == "running" and (await client.job("mid"))["state"] == "running"
    finally:
        await sub.unsubscribe()
        await client.close()


async def test_online_serving_on_a_cluster_full_of_a_young_gang_starts_within_the_grace(make_stack,
                                                                                       tmp_path: Path) -> None:
    """Default minimum runtimes (no FAST_PREEMPTION): a training gang that just started protects itself
    from reclaim, not from online serving, whose class preempts lower classes at once (issue 14, bug 6)."""
    stack = make_stack([small_node("n0", gpus=8), small_node("n1", gpus=8)])
    out = tmp_path / "marks"
    out.mkdir()
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        gang = in_queue(job("train", sigterm_pod(out), replicas=16, gpu=1), "default", grace=2.0)
        assert (await client.submit(gang, job_id="train")).accepted
        await client.wait("train", states={"running"}, timeout_s=30)
        await trapping(out, [f"train-{i}" for i in range(16)])
        submitted = time.time()
        serving = in_queue(job("serve", ["sleep", "1"], gpu=1), "default", priority="online-serving")
        assert (await client.submit(serving, job_id="serve")).accepted
        await client.wait("serve", states={"running", "succeeded"}, timeout_s=30)
        waited = time.time() - submitted
        assert waited < 30, waited
        terms = sorted(p.name for p in out.iterdir() if "TERM" in p.read_text())
        assert terms == sorted(f"train-{i}" for i in range(16))  # the gang stopped whole, not one pod
        record = (await client.status("train"))["jobs"][0]
        assert record["preemptions"] == 1 and record["preempted_by"] == "serve"
        resumed = await client.wait("train", timeout_s=60)  # requeued whole, runs again once serve is done
        assert resumed["state"] == "succeeded" and resumed["attempts"] == 2
    finally:
        await client.close()


async def test_job_that_acknowledges_its_checkpoint_is_killed_before_its_grace_ends(make_stack,
                                                                                   tmp_path: Path) -> None:
    stack = make_stack([small_node("n0", gpus=4)], env=FAST_PREEMPTION)
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        # ignores SIGTERM, but writes its checkpoint and says so at once; grace 60 s
        ack = ["sh", "-c", 'trap "echo saved > ckpt.bin; touch $TIDE_CHECKPOINT_FILE" TERM; '
                           f'echo ready > {tmp_path}/$TIDE_POD_NAME; while true; do sleep 0.1; done']
        assert (await client.submit(in_queue(job("trainer", ack, gpu=4), "default", grace=60.0),
                                    job_id="trainer")).accepted
        await client.wait("trainer", states={"running"}, timeout_s=30)
        await trapping(tmp_path, ["trainer-0"])
        started = time.time()
        serving = in_queue(job("serve", ["true"], gpu=4), "default", priority="online-serving")
        assert (await client.submit(serving, job_id="serve")).accepted
        assert (await client.wait("serve", timeout_s=30))["state"] == "succeeded"
        assert time.time() - started < 15  # far less than the 60 s grace period
        for _ in range(50):
            status = await client.job("trainer")
            if status["state"] in ("pending", "running"):
                break
            await asyncio.sleep(0.1)
        assert status["state"] in ("pending", "running")
        body = await client.status("trainer")
        assert body["jobs"][0]["last_checkpoint_at"] is not None
        assert body["jobs"][0]["preemptions"] == 1
    finally:
        await client.close()


async def test_tidal_window_lends_inference_nodes_and_returns_them_on_time(make_stack, tmp_path: Path) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("queues: []\n"
                      "tides:\n"
                      "  - {lend: inference, to: training, start: '22:00', end: '07:00', returnBeforeSeconds: 600}\n")
    clock = tmp_path / "clock"
    clock.write_text("2026-12-02T12:00:00")  # midday: the window is closed
    env = {"queue": {"TIDE_QUEUE_CONFIG": str(config)},
           "placer": {"TIDE_CLOCK_FILE": str(clock), "TIDE_MIN_RUNTIME_S": "0"}}
    stack = make_stack([small_node("train-0", gpus=8, pool="training"),
                        small_node("infer-0", gpus=8, pool="inference")], env=env)
    client = await TideClient.connect(stack.info.settings_for("admin"))

    def training(name: str) -> dict:
        spec = in_queue(job(name, ["sleep", "300"], gpu=8), "default", grace=1.0)
        spec["spec"]["template"]["nodeSelector"] = {"pool": "training"}
        return spec

    try:
        for name in ("night-1", "night-2"):
            assert (await client.submit(training(name), job_id=name)).accepted
        await client.wait("night-1", states={"running"}, timeout_s=30)
        await asyncio.sleep(1.5)
        assert (await client.job("night-2"))["state"] == "pending"  # no lending by day
        clock.write_text("2026-12-02T23:00:00")  # the window opens
        lent = await client.wait("night-2", states={"running"}, timeout_s=30)
        assert lent["pods"][0]["node"] == "infer-0"
        clock.write_text("2026-12-03T06:51:00")  # 9 minutes before the end: time to give the node back
        for _ in range(100):
            status = await client.job("night-2")
            if status["state"] == "pending" and not status["pods"][0]["node"]:
                break
            await asyncio.sleep(0.1)
        assert status["state"] == "pending"
        assert "tidal window returning" in (await client.status("night-2"))["jobs"][0]["reason"] or \
            (await client.status("night-2"))["jobs"][0]["preempted_by"] == "tide"
        nodes = {n["node_id"]: n for n in await client.nodes()}
        assert nodes["infer-0"]["gpus_used_milli"] == 0  # back, empty, before 07:00
        assert (await client.job("night-1"))["state"] == "running"  # the training pool's own work stays
        serving = job("serve", ["true"], gpu=8)
        serving["spec"]["template"]["nodeSelector"] = {"pool": "inference"}
        assert (await client.submit(serving, job_id="serve")).accepted
        assert (await client.wait("serve", timeout_s=30))["state"] == "succeeded"
        clock.write_text("2026-12-03T07:30:00")  # closed: nothing goes back onto inference nodes
        await asyncio.sleep(1.5)
        assert (await client.job("night-2"))["state"] == "pending"
    finally:
        await client.close()


async def test_tidal_headroom_starts_serving_at_once_and_is_refilled_from_a_lent_node(make_stack, tmp_path: Path
                                                                                     ) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("queues: []\n"
                      "tides:\n"
                      "  - {lend: inference, to: training, start: '22:00', end: '07:00', keepGPUs: 2}\n")
    clock = tmp_path / "clock"
    clock.write_text("2026-12-02T23:00:00")  # the window is open
    env = {"queue": {"TIDE_QUEUE_CONFIG": str(config)},
           "placer": {"TIDE_CLOCK_FILE": str(clock), "TIDE_MIN_RUNTIME_S": "0"}}
    stack = make_stack([small_node("infer-0", gpus=8, pool="inference"),
                        small_node("infer-1", gpus=2, pool="inference")], env=env)
    client = await TideClient.connect(stack.info.settings_for("admin"))

    def training(name: str, gpus: int) -> dict:
        spec = in_queue(job(name, ["sleep", "300"], gpu=gpus), "default", grace=1.0)
        spec["spec"]["template"]["nodeSelector"] = {"pool": "training"}
        return spec

    try:
        assert (await client.submit(training("borrower", 8), job_id="borrower")).accepted
        assert (await client.wait("borrower", states={"running"}, timeout_s=30))["pods"][0]["node"] == "infer-0"
        assert (await client.submit(training("small", 2), job_id="small")).accepted
        await asyncio.sleep(1.5)
        assert (await client.job("small"))["state"] == "pending"  # infer-1 is the headroom: not lent
        serving = job("serve", ["sleep", "300"], gpu=2)
        serving["spec"]["template"]["nodeSelector"] = {"pool": "inference"}
        assert (await client.submit(serving, job_id="serve")).accepted
        started = await client.wait("serve", states={"running"}, timeout_s=30)
        assert started["pods"][0]["node"] == "infer-1"
        assert (await client.status("serve"))["jobs"][0]["preemptions"] == 0
        # the headroom is used up: the placer takes the lent node back to restore it (inside the open
        # window, so not the window's return)
        for _ in range(100):
            status = (await client.status("borrower"))["jobs"][0]
            if status["preempted_by"] == "tide":
                break
            await asyncio.sleep(0.1)
        assert status["preempted_by"] == "tide" and status["preemptions"] == 1
        assert (await client.job("serve"))["state"] == "running"
    finally:
        await client.close()
