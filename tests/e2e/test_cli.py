"""The `tide` command line contract: exit codes, --json fields, up --detach / down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tide.stack.launcher import Stack

from tests.helpers import job, py

TIDE = str(Path(sys.executable).parent / "tide")


def tide(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    return subprocess.run([TIDE, "--home", str(home), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_submit_wait_json_and_status(stack: Stack, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(job("cli-job", py("print('hello')"), replicas=2, gpu=1)))
    done = tide(stack.home, "submit", str(spec_file), "--wait", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["state"] == "succeeded"
    status = tide(stack.home, "status", result["job_id"], "--json")
    assert status.returncode == 0
    body = json.loads(status.stdout)
    assert {"job_id", "state", "reason", "pods"} <= body.keys()
    assert [set(p) >= {"name", "state", "node", "gpus"} for p in body["pods"]] == [True, True]
    assert all(p["state"] == "succeeded" and len(p["gpus"]) == 1 for p in body["pods"])


def test_submit_rejected_exits_2_with_reason(stack: Stack, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(job("bad", ["true"], gpu=-2)))
    out = tide(stack.home, "submit", str(bad))
    assert out.returncode == 2
    assert "spec.template.resources.gpu" in out.stderr and "greater than or equal to 0" in out.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"metadata": ')
    out = tide(stack.home, "submit", str(broken))
    assert out.returncode == 2 and "malformed JSON" in out.stderr


def test_failed_job_exits_1_and_cancel_and_nodes(stack: Stack, tmp_path: Path) -> None:
    failing = tmp_path / "fail.yaml"
    failing.write_text(yaml.safe_dump(job("cli-fail", py("raise SystemExit(5)"), gpu=1)))
    out = tide(stack.home, "submit", str(failing), "--wait")
    assert out.returncode == 1 and "exited with code 5" in out.stdout
    nodes = json.loads(tide(stack.home, "nodes", "--json").stdout)
    assert sorted(n["node_id"] for n in nodes) == ["node-0", "node-1"]
    table = tide(stack.home, "nodes").stdout.splitlines()
    assert "LOST" in table[0].split() and all(line.split()[-3] == "no" for line in table[1:]), table
    assert tide(stack.home, "status", "no-such-job").returncode == 1
    assert tide(stack.home, "cancel", "no-such-job").returncode == 1


def test_up_detach_and_down(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = tide(home, "up", "--nodes", "1", "--detach")
    try:
        assert up.returncode == 0, up.stderr
        assert "NATS (JetStream)  nats://127.0.0.1:" in up.stdout
        nodes = json.loads(tide(home, "nodes", "--json").stdout)
        assert [n["gpus"] for n in nodes] == [8]
        again = tide(home, "up", "--nodes", "1", "--detach")
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        down = tide(home, "down")
    assert down.returncode == 0
    assert not (home / "stack.json").exists()


def test_sim_openb_runs_through_the_tide_command(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"n{i},64000,262144,8,V100M32\n" for i in range(4)))
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                    "deletion_time,scheduled_time\n" + "".join(
                        f"p{i},4000,8192,1,{500 if i % 2 else 1000},,LS,Running,{i},{i + 100},{i}\n"
                        for i in range(20)))
    out = tmp_path / "result.json"
    run = tide(tmp_path / "home", "sim", "openb", "--nodes", str(nodes), "--pods", str(pods), "--policy",
               "tide", "--seed", "42", "--json", str(out))
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    result = result[0] if isinstance(result, list) else result
    assert result["policy"] == "tide" and result["gpu_capacity"] == 32000
    assert 0 < result["allocated_pct_at_100"] <= 100


def test_watch_prints_a_jobs_events_live(stack: Stack, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    watch = subprocess.Popen([TIDE, "--home", str(stack.home), "watch"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(1.5)  # let it subscribe
        spec_file = tmp_path / "job.yaml"
        spec_file.write_text(yaml.safe_dump(job("watched", py("pass"), gpu=1)))
        assert tide(stack.home, "submit", str(spec_file), "--job-id", "watched-1", "--wait").returncode == 0
        seen: list[str] = []
        assert watch.stdout is not None
        for line in watch.stdout:
            seen.append(line.split()[1])
            if "succeeded" in seen:
                break
        assert seen.index("queued") < seen.index("placed") < seen.index("running") < seen.index("succeeded")
    finally:
        watch.terminate()
        watch.wait(timeout=10)


def test_up_demo_runs_the_readme_demo_to_completion(tmp_path: Path) -> None:
    """The README's first command: the whole stack on embedded defaults, three demo jobs, exit 0."""
    done = tide(tmp_path / "home", "up", "--demo", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo passed" in done.stdout
    assert done.stdout.count(": succeeded") == 3
    assert "stack stopped" in done.stdout
