"""Running pods as real subprocesses: environment, process group, logs, stop with grace, exit reason."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tide.schemas.events import ExitReason, StartPod

OOM_PATTERNS = re.compile(
    rb"CUDA out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|OutOfMemoryError|out of memory",
    re.IGNORECASE,
)


def pod_environment(cmd: StartPod, base: dict[str, str]) -> dict[str, str]:
    """The pod's environment: GPUs by UUID, MPS limits for shares, gang coordinates."""
    env = dict(base)
    env.update(cmd.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in cmd.gpus) if cmd.gpus else ""
    env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] or "none"
    if cmd.share_sm_percent is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cmd.share_sm_percent)
    if cmd.share_memory_mib is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={cmd.share_memory_mib}M"
    env["TIDE_JOB_ID"] = cmd.job_id
    env["TIDE_POD_NAME"] = cmd.pod
    env["TIDE_POD_INDEX"] = str(cmd.pod_index)
    env["TIDE_WORLD_SIZE"] = str(cmd.world_size)
    return env


def exit_reason(returncode: int, stopped: bool, log_tail: bytes) -> tuple[ExitReason, int | None]:
    """Classify an exit: (reason, signal number or None)."""
    sig = -returncode if returncode < 0 else None
    if stopped:
        return ExitReason.STOPPED, sig
    if returncode == 0:
        return ExitReason.COMPLETED, None
    if OOM_PATTERNS.search(log_tail):
        return ExitReason.OOM, sig
    return ExitReason.ERROR, sig


@dataclass
class PodProcess:
    cmd: StartPod
    proc: asyncio.subprocess.Process
    log_path: Path
    stopping: bool = False
    waiter: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"{self.cmd.job_id}/{self.cmd.pod}"

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``grace_s``."""
        if self.proc.returncode is not None:
            return
        self.stopping = True
        _killpg(self.proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), timeout=grace_s)
        except TimeoutError:
            _killpg(self.proc.pid, signal.SIGKILL)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


ExitCallback = Callable[[PodProcess, int, ExitReason, int | None, str], Awaitable[None]]


async def launch(cmd: StartPod, work_dir: Path, on_exit: ExitCallback) -> PodProcess:
    """Start the pod's command in its own session (process group); call ``on_exit`` when it ends."""
    pod_dir = work_dir / cmd.job_id
    pod_dir.mkdir(parents=True, exist_ok=True)
    log_path = pod_dir / f"{cmd.pod}.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd.command,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env=pod_environment(cmd, dict(os.environ)),
            cwd=pod_dir,
            start_new_session=True,
        )
    finally:
        log_file.close()
    pod = PodProcess(cmd=cmd, proc=proc, log_path=log_path)

    async def wait() -> None:
        rc = await proc.wait()
        _killpg(proc.pid, signal.SIGKILL)  # reap anything the pod left behind in its group
        tail = _tail(log_path)
        reason, sig = exit_reason(rc, pod.stopping, tail)
        message = tail.decode(errors="replace").strip().splitlines()[-1][:200] if tail.strip() else ""
        await on_exit(pod, rc, reason, sig, message if reason != ExitReason.COMPLETED else "")

    pod.waiter = asyncio.create_task(wait())
    return pod


def _tail(path: Path, size: int = 16384) -> bytes:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - size))
        return f.read()
