"""No poison messages, through a live stack (real NATS and Redis): hostile specs the queue accepts and a hostile
registration a node agent may send cannot stop the placer, a message a handler keeps failing on goes to the DLQ
stream with the reason (``tide describe``, ``tide_dead_letters_total``) instead of being retried for ever, and a
normal job still succeeds afterwards, with every service the very process it was."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from redis.asyncio import Redis
from tide import subjects
from tide.client import TideClient
from tide.schemas.events import CancelJob
from tide.store import keys

from tests.conftest import StackFactory
from tests.helpers import job, small_node
from tests.poison import (
    assert_all_alive,
    bad_registration,
    connect_as,
    hostile_specs,
    normal_job_succeeds,
    pids,
    wait_dead_letter,
)

TIDE = str(Path(sys.executable).parent / "tide")
def tide_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    return subprocess.run([TIDE, "--home", str(home), *args], capture_output=True, text=True, timeout=60, env=env)


def dead_letters_metric(metrics_url: str, consumer: str) -> float | None:
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith("tide_dead_letters_total{") and f'consumer="{consumer}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_hostile_specs_and_a_poison_message_cannot_stop_the_stack(make_stack: StackFactory) -> None:
    services = ("queue", "placer", "metrics")
    stack = make_stack([small_node("n0"), small_node("n1")],
                       env={name: {"TIDE_DEAD_LETTER_AFTER": "3"} for name in services})
    assert stack.info is not None
    before = pids(stack)
    client = await TideClient.connect(stack.info.settings_for("admin"))
    redis = Redis.from_url(stack.info.redis_url("queue"), decode_responses=True)
    admin = await connect_as(stack, "admin")
    node = await connect_as(stack, "node-n0")
    try:
        # hostile but valid: every one accepted, and the placer judges each
        for name, spec in hostile_specs().items():
            result = await client.submit(spec, job_id=f"hostile-{name}")
            assert result.accepted, (name, result)
        assert (await client.submit(job("target", ["true"], gpu=1), job_id="poison-target")).accepted
        assert (await client.wait("poison-target", timeout_s=60))["state"] == "succeeded"

        # JSON nested deeper than Python's parser recurses: a clean rejection, not a handler exception
        deep = b"[" * 5000 + b"]" * 5000
        await admin.publish(subjects.JOB_SUBMIT, deep, headers={"Tide-Job-Id": "deep-one"})
        # a registration the placer takes but the planner cannot build; then a message the queue's handler
        # raises on every time: a well-formed cancel of a job whose stored record cannot be read (written
        # straight into Redis here)
        await node.publish(subjects.node_status("n0"), bad_registration())
        await redis.set(keys.job("poison-record"), '{"job_id": "poison-record", "state": "no such state"}')
        cancel = CancelJob(job_id="poison-record", reason="poison").to_bytes()
        await admin.publish(subjects.JOB_CANCEL, cancel, headers={"Tide-Job-Id": "poison-record"})
        await admin.flush()
        await node.flush()

        letters = await wait_dead_letter(stack, "queue-intake", timeout_s=30)
        assert len(letters) == 1, letters  # the cancel's, and none for the deep submission
        letter, body = letters[0]
        assert (letter.subject, letter.job_id, letter.deliveries) == (subjects.JOB_CANCEL, "poison-record", 3)
        assert letter.error.startswith("ValidationError: ") and "JobRecord" in letter.error, letter.error
        assert body == cancel and letter.size == len(cancel)
        await asyncio.sleep(2.0)  # terminated, not redelivered: still the one dead letter
        assert len(await wait_dead_letter(stack, "queue-intake", timeout_s=0)) == 1
        rejected = await client.job("deep-one")
        assert rejected is not None and rejected["state"] == "rejected", rejected
        assert rejected["reason"] == "payload: malformed JSON: nested too deep", rejected

        # visible in `tide describe` (the record cannot be read: no job, but its dead letter) and in the metrics
        desc = tide_cli(stack.home, "describe", "poison-record")
        assert desc.returncode == 1 and "no job 'poison-record'" in desc.stderr, desc.stderr
        assert "Dead letters:" in desc.stdout and "consumer queue-intake  subject tide.jobs.cancel" in desc.stdout
        assert "after 3 deliveries" in desc.stdout and "reason: ValidationError: " in desc.stdout, desc.stdout
        for _ in range(40):
            if dead_letters_metric(stack.info.metrics_url, "queue-intake") == 1.0:
                break
            await asyncio.sleep(0.25)
        assert dead_letters_metric(stack.info.metrics_url, "queue-intake") == 1.0
        assert dead_letters_metric(stack.info.metrics_url, "placer-node-status") == 0.0

        # nothing stopped: same processes, and a normal job runs (on n1: n0's inventory is refused)
        done = await normal_job_succeeds(client, "after-poison", timeout_s=60)
        assert done["state"] == "succeeded", done
        assert {p["node"] for p in done["pods"]} == {"n1"}
        assert_all_alive(stack, before)
        states = {name: (await client.job(f"hostile-{name}"))["state"] for name in hostile_specs()}
        assert states["huge-gang"] == "unschedulable" and states["mig-nowhere"] == "unschedulable", states
        placer_log = (stack.home / "logs" / "placer.log").read_text()
        assert "cycle_failed" not in placer_log
        assert '"node_description_refused"' in placer_log
    finally:
        await admin.close()
        await node.close()
        await client.close()
        await redis.aclose()
