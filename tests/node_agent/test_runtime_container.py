"""Container runtimes (argv the agent would run, and a run through a stand-in CLI) and orphan reaping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tide.schemas.events import ExitReason, GpuAssignment, StartPod
from tide.schemas.node import default_h100_node
from tide_node_agent.runtime import ContainerRuntime, pod_environment, reap_orphans, record_pod

from tests.node_agent.conftest import AgentFactory


def cmd(**kw: object) -> StartPod:
    return StartPod(job_id="train", pod="train-0", pod_index=0, world_size=2, command=["python", "train.py"], **kw)


def test_docker_argv_exposes_the_gpus_by_uuid() -> None:
    c = cmd(gpus=[GpuAssignment(index=0, uuid="GPU-a"), GpuAssignment(index=1, uuid="GPU-b")], memory_mib=2048,
            env={"TIDE_IMAGE": "nvcr.io/nvidia/pytorch:24.05-py3", "LR": "0.1"})
    spec = ContainerRuntime("docker").prepare(c, pod_environment(c, dict(os.environ)), [0, 1, 2, 3, 8])
    argv = spec.argv
    assert argv[:3] == ["docker", "run", "--rm"] and "--init" in argv
    assert argv[argv.index("--name") + 1] == "tide-train-train-0"
    assert argv[argv.index("--gpus") + 1] == '"device=GPU-a,GPU-b"'
    assert argv[argv.index("--cpuset-cpus") + 1] == "0-3,8"
    assert argv[argv.index("--memory") + 1] == "2048m"
    assert "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b" in argv and "LR=0.1" in argv and "TIDE_WORLD_SIZE=2" in argv
    assert argv[-3:] == ["nvcr.io/nvidia/pytorch:24.05-py3", "python", "train.py"]
    assert spec.cleanup_argv == ["docker", "rm", "-f", "tide-train-train-0"]


def test_podman_and_nerdctl_with_mps_share() -> None:
    c = cmd(gpus=[GpuAssignment(index=2, uuid="GPU-c", milli=250, memory_mib=4096)], share_sm_percent=25,
            share_memory_mib=4096)
    env = pod_environment(c, {}, mps_dirs=(Path("/run/tide/mps/pipe"), Path("/run/tide/mps/log")))
    for kind in ("podman", "nerdctl"):
        argv = ContainerRuntime(kind, command=f"/usr/bin/{kind}", image="img:1").prepare(c, env, None).argv
        assert argv[0] == f"/usr/bin/{kind}" and argv[argv.index("--gpus") + 1] == "device=GPU-c"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in argv and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in argv
        assert argv[argv.index("--ipc") + 1] == "host" and "/run/tide/mps/pipe:/run/tide/mps/pipe" in argv
    with pytest.raises(ValueError, match="no container image"):
        ContainerRuntime("docker").prepare(c, env, None)
    # the job spec's image (template.image, carried by StartPod) wins over the agent's default
    with_image = cmd(image="ghcr.io/team/serve:2")
    argv = ContainerRuntime("docker", image="img:1").prepare(with_image, pod_environment(with_image, {}), None).argv
    assert argv[-3:] == ["ghcr.io/team/serve:2", "python", "train.py"]
    with pytest.raises(ValueError, match="unknown runtime"):
        ContainerRuntime("lxc")


async def test_agent_runs_pods_through_the_configured_container_cli(make_agent: AgentFactory, tmp_path: Path) -> None:
    # a stand-in "docker": records its argv, then runs the command after the image (as the container would)
    record = tmp_path / "argv.txt"
    fake = tmp_path / "fake-docker"
    fake.write_text(
        f"#!{sys.executable}\nimport os, sys\nopen({str(record)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
        "args = sys.argv[1:]\ni = args.index('img:1')\nos.execvp(args[i + 1], args[i + 1:])\n"
    )
    fake.chmod(0o755)
    node = default_h100_node("n0")
    agent = make_agent(node, runtime="docker", runtime_command=str(fake), runtime_image="img:1")
    ack = await agent._start(StartPod(job_id="c", pod="c-0", pod_index=0, world_size=1,
                                      command=[sys.executable, "-c", "print('in the container')"],
                                      gpus=[GpuAssignment(index=5, uuid=node.gpus[5].uuid or "")]))
    assert ack.ok, ack.error
    assert (await agent.exited("c-0")).reason == ExitReason.COMPLETED
    argv = record.read_text().splitlines()
    assert argv[:2] == ["run", "--rm"] and argv[argv.index("--gpus") + 1] == f"device={node.gpus[5].uuid}"
    assert "in the container" in (agent.work_dir / "c" / "c-0.log").read_text()


def test_a_restarted_agent_reaps_the_pods_a_dead_one_left(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        record_pod(tmp_path / "pids", "j/j-0", proc.pid)
        assert reap_orphans(tmp_path / "pids") == ["j/j-0"]
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert not list((tmp_path / "pids").glob("*"))
        # a stale record whose pid now belongs to someone else is left alone
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        (tmp_path / "pids" / "k__k-0.pid").write_text(f"{other.pid} 1\n")
        assert reap_orphans(tmp_path / "pids") == []
        time.sleep(0.1)
        assert other.poll() is None
        other.kill()
        other.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
