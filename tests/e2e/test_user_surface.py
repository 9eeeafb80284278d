"""What users of Slurm and kubectl reach for, through a live stack: logs, inline submit, describe,
output formats, completion, and job specs written with Kubernetes / NVIDIA resource names."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
import yaml
from tide import subjects
from tide.client import TideClient
from tide.stack.auth import node_user
from tide.stack.launcher import Stack

from tests.conftest import StackFactory
from tests.helpers import small_node

TIDE = str(Path(sys.executable).parent / "tide")


def tide_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}


def tide(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TIDE, "--home", str(home), *args], capture_output=True, text=True, timeout=timeout,
                          env=tide_env())


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def two_pools(make_stack: StackFactory) -> Stack:
    return make_stack([small_node("node-0", pool="a"), small_node("node-1", pool="b")])


def submit_inline(home: Path, *args: str) -> dict:
    out = tide(home, "submit", "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


PRINTER = ("import os, sys; name = os.environ['TIDE_POD_NAME']; "
           "[print(f'{name} line {i}') for i in range(3)]; print(f'{name} to stderr', file=sys.stderr)")


def test_inline_submit_logs_and_describe(two_pools: Stack) -> None:
    home = two_pools.home
    done = submit_inline(home, "--gpus", "1", "--replicas", "2", "--name", "printer", "--selector", "pool=a",
                         "--wait", "--", sys.executable, "-c", PRINTER)
    job_id = done["job_id"]
    assert done["state"] == "succeeded" and job_id.startswith("printer-")
    assert [len(p["gpus"]) for p in done["pods"]] == [1, 1]

    # every pod, prefixed; one pod, raw; its tail; stdout and stderr both
    both = tide(home, "logs", job_id)
    assert both.returncode == 0, both.stderr
    pods = sorted(p["name"] for p in done["pods"])
    for pod in pods:
        for i in range(3):
            assert f"[{pod}] {pod} line {i}" in both.stdout.splitlines()
        assert f"[{pod}] {pod} to stderr" in both.stdout.splitlines()
    one = tide(home, "logs", job_id, pods[1])
    assert one.returncode == 0 and sorted(one.stdout.splitlines()) == sorted(
        [f"{pods[1]} line {i}" for i in range(3)] + [f"{pods[1]} to stderr"])
    tail = tide(home, "logs", job_id, pods[0], "--tail", "1")
    assert len(tail.stdout.splitlines()) == 1 and tail.stdout.strip() in one.stdout.replace(pods[1], pods[0])
    attempt = tide(home, "logs", job_id, pods[0], "--attempt", "99")
    assert attempt.returncode == 1 and "no logs for pod" in one_line(attempt.stderr)
    unknown = tide(home, "logs", "no-such-job")
    assert unknown.returncode == 1 and one_line(unknown.stderr) == "tide: no job 'no-such-job'"
    no_pod = tide(home, "logs", job_id, "nope-7")
    assert no_pod.returncode == 1 and "has no pod 'nope-7'" in one_line(no_pod.stderr)

    # describe: spec, state, every event with its code and timestamp
    desc = tide(home, "describe", job_id)
    assert desc.returncode == 0, desc.stderr
    text = desc.stdout
    assert f"Job:        {job_id}" in text and "State:      succeeded" in text
    assert "nodeSelector:" in text and "pool: a" in text  # the spec
    for code in ("Queued", "Reserved", "PodStarted", "Running", "PodExited/Completed", "Succeeded"):
        assert f"  {code} " in text, (code, text)
    events = json.loads(tide(home, "describe", job_id, "-o", "json").stdout)["events"]
    assert [e["code"] for e in events][0] == "Queued" and events[-1]["code"] == "Succeeded"
    assert all(e["ts"] > 0 for e in events)

    # an impossible job: unschedulable, with its structured code
    out = tide(home, "submit", "--json", "--gpus", "16", "--wait", "--timeout", "60", "--", "true")
    big = json.loads(out.stdout)
    assert out.returncode == 1 and big["state"] == "unschedulable"
    desc = json.loads(tide(home, "describe", big["job_id"], "-o", "json").stdout)
    assert desc["code"] == "Unschedulable/InsufficientGPU"
    assert "Unschedulable/InsufficientGPU" in [e["code"] for e in desc["events"]]

    # bad inline input: exit 2, naming the field and the flag, nothing submitted
    bad = tide(home, "submit", "--gpus", "-1", "--", "true")
    assert bad.returncode == 2
    assert one_line(bad.stderr) == ("rejected: spec.template.resources.gpu (--gpus): Input should be greater "
                                    "than or equal to 0")
    assert tide(home, "describe", "no-such-job").returncode == 1

    # list output: formats, filters, columns
    table = tide(home, "status").stdout.splitlines()
    assert table[0].split() == ["JOB", "STATE", "QUEUE", "GPUS", "AGE", "ELAPSED", "REASON"]
    mine = next(line.split() for line in table if line.startswith(job_id))
    assert mine[1:4] == ["succeeded", "default", "2"]
    as_json = json.loads(tide(home, "status", "-o", "json", "--state", "unschedulable").stdout)
    assert [j["job_id"] for j in as_json] == [big["job_id"]] and as_json[0]["gpus"] == "16"
    as_yaml = yaml.safe_load(tide(home, "status", "-o", "yaml", "--queue", "default", "--state", "succeeded").stdout)
    assert [j["job_id"] for j in as_yaml] == [job_id] and as_yaml[0]["elapsed"] != "-"
    wide = tide(home, "status", "-o", "wide").stdout.splitlines()
    assert "NODES" in wide[0].split() and "node-0" in next(line for line in wide if line.startswith(job_id))
    assert json.loads(tide(home, "status", "--queue", "elsewhere", "-o", "json").stdout) == []
    nodes = yaml.safe_load(tide(home, "nodes", "-o", "yaml").stdout)
    assert sorted(n["node_id"] for n in nodes) == ["node-0", "node-1"]
    assert "LABELS" in tide(home, "nodes", "-o", "wide").stdout.splitlines()[0]
    assert "default" in json.loads(tide(home, "queues", "-o", "json").stdout)


def test_logs_follow_chunks_and_a_node_that_is_gone(two_pools: Stack) -> None:
    home = two_pools.home
    # more than one 64 KiB reply, byte for byte
    big = submit_inline(home, "--gpus", "1", "--name", "chatty", "--selector", "pool=b", "--wait", "--",
                        sys.executable, "-c", "[print(f'{i:06d} ' + 'x' * 60) for i in range(4000)]")
    assert big["state"] == "succeeded"
    out = tide(home, "logs", big["job_id"])
    assert out.returncode == 0, out.stderr
    assert out.stdout == "".join(f"{i:06d} " + "x" * 60 + "\n" for i in range(4000))
    assert len(out.stdout) > 4 * 64 * 1024
    assert tide(home, "logs", big["job_id"], "--tail", "2").stdout.splitlines()[0].startswith("003998 ")

    # -f follows a running pod until it ends
    slow = submit_inline(home, "--gpus", "1", "--name", "slow", "--selector", "pool=a", "--",
                         sys.executable, "-c", "import time\nfor i in range(6):\n print('tick', i, flush=True)\n"
                                               " time.sleep(0.4)")
    follow = subprocess.Popen([TIDE, "--home", str(home), "logs", "-f", slow["job_id"]], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=tide_env())
    stdout, stderr = follow.communicate(timeout=90)
    assert follow.returncode == 0, stderr
    assert stdout.splitlines() == [f"tick {i}" for i in range(6)]
    for _ in range(50):  # the pod's exit rides on the agent's next heartbeat (up to one later than its log)
        status = json.loads(tide(home, "status", slow["job_id"], "--json").stdout)
        if status["state"] != "running":
            break
        time.sleep(0.2)
    assert status["state"] == "succeeded"

    # the node holding the pod is gone: one line, exit 1
    two_pools.kill("agent-node-1")
    gone = tide(home, "logs", big["job_id"], timeout=60)
    assert gone.returncode == 1
    assert one_line(gone.stderr).startswith("tide: node node-1 is not answering"), gone.stderr


def test_a_spec_with_kubernetes_resource_names_runs(two_pools: Stack, tmp_path: Path) -> None:
    spec = {
        "apiVersion": "tide/v1", "kind": "Job", "metadata": {"name": "k8s-names"},
        "spec": {"template": {
            "command": [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
            "resources": {"nvidia.com/gpu": 2, "memory": "64Gi", "cpu": "4",
                          "gpuModel": ["NVIDIA-A100-SXM4-80GB"]}}},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = tide(two_pools.home, "submit", str(path), "--wait", "--json")
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["state"] == "succeeded" and [len(p["gpus"]) for p in job["pods"]] == [2]
    stored = json.loads(tide(two_pools.home, "describe", job["job_id"], "-o", "json").stdout)["job"]["spec"]
    resources = stored["spec"]["template"]["resources"]
    assert (resources["gpu"], resources["memoryMiB"], resources["cpuMilli"], resources["gpuModel"]) == (
        2, 65536, 4000, ["A100-80GB"])
    # a malformed alias is bad input naming it
    spec["spec"]["template"]["resources"] = {"nvidia.com/gpu": 2, "memory": "64 gigs"}
    path.write_text(yaml.safe_dump(spec))
    bad = tide(two_pools.home, "submit", str(path))
    assert bad.returncode == 2 and "memory: '64 gigs' is not a quantity" in bad.stderr


def test_describe_links_resubmissions(two_pools: Stack) -> None:
    """The feedback loop resubmits an OOM-failed job X as X-r1 (tide.core.feedback.resubmit_id); describe
    links the two both ways (here the two jobs are submitted by hand under those ids)."""
    home = two_pools.home
    for job_id in ("linked", "linked-r1"):
        out = tide(home, "submit", "--job-id", job_id, "--wait", "--", "true")
        assert out.returncode == 0, out.stderr
    first = json.loads(tide(home, "describe", "linked", "-o", "json").stdout)
    assert first["links"] == {"resubmitted_as": "linked-r1"}
    assert first["events"][-1] == {**first["events"][-1], "code": "Resubmitted", "text": "resubmitted as linked-r1"}
    second = tide(home, "describe", "linked-r1").stdout
    assert "Resubmission of: linked" in second and "resubmission of linked" in second


def test_describe_a_rejected_job(two_pools: Stack, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"metadata": {"name": "bad"}, "spec": {"template": {
        "command": ["true"], "resources": {"gpu": -1}}}}))
    assert tide(two_pools.home, "submit", str(path), "--job-id", "bad-one").returncode == 2
    out = tide(two_pools.home, "describe", "bad-one")
    assert out.returncode == 0, out.stderr
    assert "State:      rejected" in out.stdout and "Rejected/InvalidSpec" in out.stdout
    logs = tide(two_pools.home, "logs", "bad-one")
    assert logs.returncode == 1 and "was rejected" in one_line(logs.stderr)


async def test_only_a_nodes_own_agent_serves_its_logs(two_pools: Stack) -> None:
    info = two_pools.info
    assert info is not None
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(info.nats_url, user=node_user("node-0"), password=info.passwords[node_user("node-0")],
                            error_cb=on_error, inbox_prefix=subjects.node_inbox_prefix("node-0"),
                            max_reconnect_attempts=0)
    client = await TideClient.connect(info.settings_for("admin"))
    try:
        await nc.subscribe(subjects.node_logs("node-1"))  # another node's logs: refused
        await nc.flush()
        for _ in range(40):
            if errors:
                break
            await asyncio.sleep(0.05)
        assert 'permissions violation for subscription to "tide.node.node-1.logs"' in " ".join(
            str(e) for e in errors).lower()
        listed = await client.node_logs("node-1", {"job_id": "nothing-here"})  # admin may ask any node
        assert listed == {"ok": True, "node_id": "node-1", "pods": []}
        refused = await client.node_logs("node-1", {"job_id": "x", "pod": "../../etc/passwd"})
        assert refused["ok"] is False
    finally:
        await nc.close()
        await client.close()


def test_version_completion_and_schema(tmp_path: Path) -> None:
    version = tide(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.startswith("tide ")
    for shell in ("bash", "zsh"):
        script = tide(tmp_path, "completion", shell)
        assert script.returncode == 0 and "complete -F _tide tide" in script.stdout
        assert "logs" in script.stdout and "--share-mem" in script.stdout
    check = subprocess.run(["bash", "-n"], input=tide(tmp_path, "completion", "bash").stdout, text=True)
    assert check.returncode == 0
    schema = json.loads(tide(tmp_path, "schema").stdout)
    assert schema == json.loads((Path(__file__).resolve().parents[2] / "docs" / "jobspec.schema.json").read_text())


def wait_state(home: Path, job_id: str, states: set[str], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = json.loads(tide(home, "status", job_id, "--json").stdout)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.3)


def test_describe_a_preemption_and_logs_of_each_attempt(two_pools: Stack) -> None:
    home = two_pools.home
    sleeper = "import os, time; print('attempt', os.environ['TIDE_ATTEMPT'], flush=True); time.sleep(120)"
    victim = submit_inline(home, "--gpus", "2", "--priority", "best-effort", "--selector", "pool=b", "--name",
                           "victim", "--", sys.executable, "-c", sleeper)["job_id"]
    first = wait_state(home, victim, {"running"})
    deadline = time.monotonic() + 30
    while "attempt" not in tide(home, "logs", victim).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    urgent = submit_inline(home, "--gpus", "2", "--priority", "online-serving", "--selector", "pool=b", "--name",
                           "urgent", "--wait", "--timeout", "90", "--", "true")
    assert urgent["state"] == "succeeded"
    second = wait_state(home, victim, {"running"})
    assert second["attempts"] > first["attempts"]

    desc = json.loads(tide(home, "describe", victim, "-o", "json").stdout)
    preempted = [e for e in desc["events"] if e["code"] == "Preempted"]
    assert preempted and f"preempted by {urgent['job_id']}" in preempted[0]["text"], desc["events"]
    assert "Requeued/Preempted" in [e["code"] for e in desc["events"]]

    deadline = time.monotonic() + 30
    while f"attempt {second['attempts']}" not in tide(home, "logs", victim).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    old = tide(home, "logs", victim, "--attempt", str(first["attempts"]))
    assert old.returncode == 0 and old.stdout.strip() == f"attempt {first['attempts']}"
    assert tide(home, "cancel", victim, "--wait").returncode == 0
