"""The node agent's pod runtime: environment, exit classification, stopping the whole process group."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from tide.schemas.events import ExitReason, GpuAssignment, StartPod
from tide_node_agent.runtime import exit_reason, launch, pod_environment


def start(command: list[str], **kw: object) -> StartPod:
    return StartPod(job_id="j", pod="j-0", pod_index=0, world_size=1, command=command, **kw)


def test_environment_for_whole_gpus_and_shares() -> None:
    whole = pod_environment(start(["x"], gpus=[GpuAssignment(index=0, uuid="GPU-a"),
                                               GpuAssignment(index=3, uuid="GPU-d")]), {})
    assert whole["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-d"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in whole
    share = pod_environment(start(["x"], gpus=[GpuAssignment(index=1, uuid="GPU-b", milli=250, memory_mib=4096)],
                                  share_sm_percent=25, share_memory_mib=4096), {})
    assert share["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert share["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    cpu_only = pod_environment(start(["x"]), {"CUDA_VISIBLE_DEVICES": "GPU-leak"})
    assert cpu_only["CUDA_VISIBLE_DEVICES"] == ""


def test_exit_reasons() -> None:
    assert exit_reason(0, False, b"") == (ExitReason.COMPLETED, None)
    assert exit_reason(1, False, b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB") == (
        ExitReason.OOM, None)
    assert exit_reason(1, False, b"ValueError") == (ExitReason.ERROR, None)
    assert exit_reason(-15, True, b"") == (ExitReason.STOPPED, 15)
    assert exit_reason(-9, False, b"") == (ExitReason.ERROR, 9)


async def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    # the pod ignores SIGTERM and leaves a grandchild behind: both must be gone after stop
    code = (
        "import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        f"open({str(child_pid)!r}, 'w').write(str(p.pid)); time.sleep(300)"
    )
    exits: list[tuple[int, ExitReason]] = []

    async def on_exit(pod, rc, reason, sig, message) -> None:
        exits.append((rc, reason))

    pod = await launch(start([sys.executable, "-c", code]), tmp_path, on_exit)
    for _ in range(100):
        if child_pid.exists() and child_pid.read_text():
            break
        await asyncio.sleep(0.05)
    await pod.stop(grace_s=0.5)
    assert pod.waiter is not None
    await asyncio.wait_for(pod.waiter, 5)
    assert exits == [(-9, ExitReason.STOPPED)]
    grandchild = int(child_pid.read_text())
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("grandchild survived the stop")
