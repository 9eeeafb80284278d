"""The CLI with a service down (one line, exit 1, no traceback, no ghost job), idempotent submission
with one job id, and cancelling a job that has already finished."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import yaml
from tide.client import TideClient
from tide.stack.launcher import Stack

from tests.e2e.test_cli import tide
from tests.helpers import job, py


def one_line(out: str) -> str:
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out, out
    return lines[0]


def jobs_named(home: Path, name: str) -> list[dict]:
    listed = tide(home, "status", "--json", "--limit", "500")
    assert listed.returncode == 0, listed.stderr
    return [j for j in json.loads(listed.stdout) if j["job_id"].startswith(f"{name}-")]


def test_a_stopped_service_is_one_line_and_submit_leaves_no_ghost_job(stack: Stack, tmp_path: Path) -> None:
    assert stack.info is not None
    url = stack.info.nats_url
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job("ghost", py("pass"), gpu=1)))
    stack.kill("queue", signal.SIGTERM)
    stack.kill("placer", signal.SIGTERM)
    queue_down = f"tide: the queue service is not answering at {url} (is 'tide up' running?)"
    for args in (["submit", str(spec)], ["status"], ["status", "some-job"], ["cancel", "some-job"], ["queues"]):
        out = tide(stack.home, *args, timeout=60)
        assert out.returncode == 1 and one_line(out.stderr) == queue_down, (args, out.stderr)
    nodes = tide(stack.home, "nodes")
    assert nodes.returncode == 1
    assert one_line(nodes.stderr) == f"tide: the placer service is not answering at {url} (is 'tide up' running?)"

    stack.kill("nats", signal.SIGTERM)
    out = tide(stack.home, "status", timeout=30)
    assert out.returncode == 1
    assert one_line(out.stderr) == f"tide: NATS is not answering at {url} (is 'tide up' running?)"
    stack.restart("nats")
    stack.restart("queue")
    stack.restart("placer")

    # The submission refused while the queue was down did not wait in the stream to become a second job.
    again = tide(stack.home, "submit", str(spec), "--wait")
    assert again.returncode == 0, again.stderr
    assert [j["job_id"] for j in jobs_named(stack.home, "ghost")] == [again.stdout.split()[0]]


async def test_resubmitting_one_id_is_one_job_and_cancel_of_a_finished_job_is_a_no_op(
    stack: Stack, client: TideClient, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job("once", py("pass"), gpu=1)))
    first = tide(stack.home, "submit", str(spec), "--job-id", "once-1", "--wait", "--json")
    assert first.returncode == 0, first.stderr
    ran = json.loads(first.stdout)
    assert ran["state"] == "succeeded"
    second = tide(stack.home, "submit", str(spec), "--job-id", "once-1", "--wait", "--json")
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["state"] == "succeeded"
    assert (again["started_at"], again["attempts"]) == (ran["started_at"], ran["attempts"])  # not run twice
    assert [j["job_id"] for j in jobs_named(stack.home, "once")] == ["once-1"]

    cancel = tide(stack.home, "cancel", "once-1")
    assert cancel.returncode == 0
    assert cancel.stdout.strip() == "job once-1 already succeeded; nothing to cancel"
    assert (await client.job("once-1"))["state"] == "succeeded"

    # A queue that is stalled (alive, not answering) gets the same submission again, with the same id,
    # once each attempt times out; when it wakes up, it makes one job of them.
    queue_pid = stack.procs["queue"].pid
    os.kill(queue_pid, signal.SIGSTOP)
    try:
        submit = asyncio.create_task(client.submit(job("stalled", py("pass"), gpu=1), timeout_s=9, attempts=3))
        await asyncio.sleep(6.5)  # the status probe (2 s) and two attempts (3 s each) have timed out
    finally:
        os.kill(queue_pid, signal.SIGCONT)
    result = await submit
    assert result.accepted
    assert (await client.wait(result.job_id, timeout_s=60))["state"] == "succeeded"
    assert [j["job_id"] for j in jobs_named(stack.home, "stalled")] == [result.job_id]
