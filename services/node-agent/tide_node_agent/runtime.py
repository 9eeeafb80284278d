"""Running pods: environment, subprocess or container runtime, MPS, CPU pinning, logs, stop, exit reason.

A pod is always a local process in its own session (process group): the command itself
(``SubprocessRuntime``) or the container CLI's ``run`` client (``ContainerRuntime``: docker, podman,
nerdctl with ``--gpus device=<uuids>``). Its stdout and stderr go to ``<work_dir>/<job>/<pod>.log``.
Stopping sends SIGTERM to the whole group, waits the grace period, then SIGKILLs the group (and
removes the container, which a killed client would leave behind).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import re
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from tide.schemas.events import ExitReason, StartPod, parse_agent_pod_id

from tide_node_agent import pod_leader

log = structlog.get_logger()

OOM_PATTERNS = re.compile(
    rb"CUDA out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|OutOfMemoryError|out of memory",
    re.IGNORECASE,
)
AT_LIMIT_RATIO = 0.95
"""A pod whose GPU memory reached this share of its limit and then failed is reported as OOM."""


CHECKPOINT_ENV = "TIDE_CHECKPOINT_FILE"
CHECKPOINT_POLL_S = 0.05


AGENT_ONLY_PREFIXES = ("TIDE_NATS_", "TIDE_REDIS_")
SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN", "CREDENTIAL")


def agent_secret(name: str) -> bool:
    """A variable of the agent's environment that a pod must not inherit: its NATS and Redis settings and any
    ``TIDE_*`` whose name says it is a secret (docs/security.md)."""
    return name.startswith(AGENT_ONLY_PREFIXES) or (name.startswith("TIDE_") and any(w in name for w in SECRET_WORDS))


def pod_environment(cmd: StartPod, base: dict[str, str], gpu_uuids: list[str] | None = None,
                    mps_dirs: tuple[Path, Path] | None = None) -> dict[str, str]:
    """The pod's environment: GPUs (or MIG instances) by UUID, MPS limits for shares, gang coordinates.

    ``gpu_uuids`` overrides the assignment's UUIDs (the agent resolves MIG instances to their real UUIDs).
    """
    env = {k: v for k, v in base.items() if not agent_secret(k)}  # the agent's credentials stay with it
    env.update(cmd.env)
    uuids = gpu_uuids if gpu_uuids is not None else [g.uuid for g in cmd.gpus]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] or "none"
    if cmd.share_sm_percent is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cmd.share_sm_percent)
    if cmd.share_memory_mib is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={cmd.share_memory_mib}M"
    if mps_dirs is not None and (cmd.share_sm_percent is not None or cmd.share_memory_mib is not None):
        env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"] = str(mps_dirs[0]), str(mps_dirs[1])
    env["TIDE_JOB_ID"] = cmd.job_id
    name, attempt = parse_agent_pod_id(cmd.pod)
    env["TIDE_POD_NAME"] = name
    env["TIDE_ATTEMPT"] = str(attempt)
    env["TIDE_POD_INDEX"] = str(cmd.pod_index)
    env["TIDE_WORLD_SIZE"] = str(cmd.world_size)
    return env


def exit_reason(
    returncode: int, stopped: bool, log_tail: bytes, at_limit: bool = False
) -> tuple[ExitReason, int | None]:
    """Classify an exit: (reason, signal number or None).

    OOM: the pod failed and either printed a CUDA out-of-memory message or its GPU memory had reached
    its limit (``at_limit``, from NVML or the simulator).
    """
    sig = -returncode if returncode < 0 else None
    if stopped:
        return ExitReason.STOPPED, sig
    if returncode == 0:
        return ExitReason.COMPLETED, None
    if at_limit or OOM_PATTERNS.search(log_tail):
        return ExitReason.OOM, sig
    return ExitReason.ERROR, sig


# ---------------------------------------------------------------- runtimes
@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]
    cpus: list[int] | None = None
    """CPUs to pin the process to (set in the child before exec)."""
    cleanup_argv: list[str] | None = None
    """run after a SIGKILL (e.g. remove the container the killed client leaves behind)."""
    name: str | None = None


class SubprocessRuntime:
    name = "subprocess"

    def prepare(self, cmd: StartPod, env: dict[str, str], cpus: list[int] | None) -> LaunchSpec:
        return LaunchSpec(argv=list(cmd.command), env=env, cpus=cpus)


def _cpu_list(cpus: list[int]) -> str:
    """[0,1,2,5] -> '0-2,5' (the --cpuset-cpus syntax)."""
    runs: list[list[int]] = []
    for c in sorted(set(cpus)):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


class ContainerRuntime:
    """docker / podman / nerdctl ``run``: the GPUs by UUID through ``--gpus device=...``."""

    KINDS = ("docker", "podman", "nerdctl")

    def __init__(self, kind: str, command: str | None = None, image: str | None = None) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"unknown runtime {kind!r}: subprocess, docker, podman or nerdctl")
        self.name = kind
        self.command = command or kind
        self.image = image

    def container_name(self, cmd: StartPod) -> str:
        return f"tide-{cmd.job_id}-{cmd.pod}"[:128]

    def prepare(self, cmd: StartPod, env: dict[str, str], cpus: list[int] | None) -> LaunchSpec:
        image = cmd.image or cmd.env.get("TIDE_IMAGE") or self.image
        if not image:
            raise ValueError("no container image: set the job's template.image (or TIDE_IMAGE in its env), "
                             "or TIDE_RUNTIME_IMAGE on the agent")
        name = self.container_name(cmd)
        argv = [self.command, "run", "--rm", "--init", "--name", name,
                "--label", f"tide.job={cmd.job_id}", "--label", f"tide.pod={cmd.pod}"]
        uuids = env.get("CUDA_VISIBLE_DEVICES", "")
        if uuids:
            # docker parses --gpus as CSV: several devices need the value quoted as one field
            argv += ["--gpus", f'"device={uuids}"' if "," in uuids else f"device={uuids}"]
        if cpus:
            argv += ["--cpuset-cpus", _cpu_list(cpus)]
        if cmd.memory_mib:
            argv += ["--memory", f"{cmd.memory_mib}m"]
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
        if pipe:  # MPS clients talk to the host's daemon through its pipe directory and need the host IPC
            argv += ["--ipc", "host", "-v", f"{pipe}:{pipe}"]
        host = os.environ
        for key in sorted(env):
            if host.get(key) != env[key] or key.startswith(("CUDA_", "TIDE_", "NVIDIA_")) or key in cmd.env:
                argv += ["-e", f"{key}={env[key]}"]
        argv += [image, *cmd.command]
        return LaunchSpec(argv=argv, env=dict(host), cpus=None, name=name,
                          cleanup_argv=[self.command, "rm", "-f", name])


def make_runtime(kind: str, command: str | None = None, image: str | None = None):
    if kind == "subprocess":
        return SubprocessRuntime()
    return ContainerRuntime(kind, command, image)


# ---------------------------------------------------------------- MPS
class MpsControl:
    """Makes sure one MPS control daemon runs on the node when shares are used.

    ``launch=False`` (simulated GPUs) records what it would run instead of running it.
    """

    def __init__(self, base_dir: Path, launch: bool, binary: str = "nvidia-cuda-mps-control") -> None:
        self.pipe_dir = base_dir / "pipe"
        self.log_dir = base_dir / "log"
        self.launch = launch
        self.binary = binary
        self.started = False
        self.planned: list[tuple[list[str], dict[str, str]]] = []

    @property
    def dirs(self) -> tuple[Path, Path]:
        return self.pipe_dir, self.log_dir

    def daemon_command(self) -> tuple[list[str], dict[str, str]]:
        return [self.binary, "-d"], {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                                     "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    async def ensure(self) -> None:
        if self.started:
            return
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv, extra = self.daemon_command()
        if not self.launch:
            self.planned.append((argv, extra))
            self.started = True
            log.info("mps_daemon_simulated", argv=argv, **extra)
            return
        if (self.pipe_dir / "control").exists():
            self.started = True
            return
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"GPU shares need MPS but {self.binary} is not installed")
        proc = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **extra})
        if await proc.wait() != 0:
            raise RuntimeError(f"{self.binary} -d failed with exit code {proc.returncode}")
        self.started = True
        log.info("mps_daemon_started", pipe_dir=str(self.pipe_dir))

    async def stop(self) -> None:
        if not (self.started and self.launch):
            return
        argv, extra = self.daemon_command()
        proc = await asyncio.create_subprocess_exec(argv[0], stdin=asyncio.subprocess.PIPE,
                                                    env={**os.environ, **extra})
        await proc.communicate(b"quit\n")
        self.started = False


# ---------------------------------------------------------------- processes
@dataclass
class PodProcess:
    cmd: StartPod
    proc: asyncio.subprocess.Process
    log_path: Path
    stopping: bool = False
    waiter: asyncio.Task[None] | None = field(default=None, repr=False)
    cleanup_argv: list[str] | None = None
    cpus: list[int] | None = None
    argv: list[str] = field(default_factory=list)
    checkpoint_path: Path | None = None
    checkpointed: bool = False
    fenced: bool = False  # stopped because the node lease ran out: the pod is lost, not stopped on request

    @property
    def key(self) -> str:
        return f"{self.cmd.job_id}/{self.cmd.pod}"

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``grace_s``.

        A pod that acknowledges its checkpoint (creates ``$TIDE_CHECKPOINT_FILE``) during the grace
        period is killed at once: it has saved its work, waiting longer only wastes GPUs.
        """
        if self.proc.returncode is not None:
            return
        self.stopping = True
        _killpg(self.proc.pid, signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + grace_s
        while self.proc.returncode is None:
            if self.checkpoint_path is not None and self.checkpoint_path.exists():
                self.checkpointed = True
                break
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), timeout=min(left, CHECKPOINT_POLL_S))
            except TimeoutError:
                pass
        if self.proc.returncode is None:
            _killpg(self.proc.pid, signal.SIGKILL)
            if self.cleanup_argv:
                await _run_quietly(self.cleanup_argv)


    def kill(self) -> None:
        """SIGKILL the whole process group now (its GPUs are wanted by another pod)."""
        if self.proc.returncode is None:
            self.stopping = True
            _killpg(self.proc.pid, signal.SIGKILL)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


async def _run_quietly(argv: list[str], timeout_s: float = 30.0) -> None:
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL)
        await asyncio.wait_for(proc.wait(), timeout_s)
    except (OSError, TimeoutError) as exc:
        log.warning("cleanup_failed", argv=argv, error=repr(exc))


ExitCallback = Callable[[PodProcess, int, ExitReason, int | None, str], Awaitable[None]]


try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None
PR_SET_PDEATHSIG = 1


POD_LEADER = Path(__file__).with_name("pod_leader.py")


def _preexec(cpus: list[int] | None) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        if _libc is not None:  # the pod's leader dies with the agent (kill -9 included), and takes its group
            _libc.prctl(PR_SET_PDEATHSIG, pod_leader.AGENT_DIED)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return preexec


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def record_pod(pids_dir: Path, key: str, pid: int) -> None:
    """Remember a pod's process group on disk, so a restarted agent can reap what the old one left."""
    pids_dir.mkdir(parents=True, exist_ok=True)
    (pids_dir / (key.replace("/", "__") + ".pid")).write_text(f"{pid} {_start_time(pid) or ''}\n")


def forget_pod(pids_dir: Path, key: str) -> None:
    (pids_dir / (key.replace("/", "__") + ".pid")).unlink(missing_ok=True)


def reap_orphans(pids_dir: Path) -> list[str]:
    """SIGKILL the process groups of pods a previous agent left running; the pods' keys."""
    reaped = []
    for f in sorted(pids_dir.glob("*.pid")) if pids_dir.exists() else []:
        try:
            pid_s, _, started = f.read_text().strip().partition(" ")
            pid = int(pid_s)
        except (OSError, ValueError):
            f.unlink(missing_ok=True)
            continue
        if _start_time(pid) == (started or None) and started:
            _killpg(pid, signal.SIGKILL)
            reaped.append(f.stem.replace("__", "/", 1))
        elif not Path(f"/proc/{pid}").exists():
            # the leader is gone (PDEATHSIG); while its group has members the pid cannot be reused, so
            # whatever still carries that process group id is what the pod left behind
            _killpg(pid, signal.SIGKILL)
        f.unlink(missing_ok=True)
    return reaped


async def launch(cmd: StartPod, work_dir: Path, on_exit: ExitCallback, spec: LaunchSpec | None = None,
                 at_limit: Callable[[PodProcess], bool] | None = None, lease_file: Path | None = None,
                 fence_grace_s: float = 5.0) -> PodProcess:
    """Start the pod in its own session (process group); call ``on_exit`` when it ends.

    ``spec`` is what a runtime prepared (argv, env, CPUs); without one the command runs as a plain
    subprocess with ``pod_environment``. ``at_limit`` is asked, once the process has ended, whether the
    pod's GPU memory had reached its limit (OOM without a message).
    """
    pod_dir = work_dir / cmd.job_id
    pod_dir.mkdir(parents=True, exist_ok=True)
    log_path = pod_dir / f"{cmd.pod}.log"
    if spec is None:
        spec = LaunchSpec(argv=list(cmd.command), env=pod_environment(cmd, dict(os.environ)))
    checkpoint_path = pod_dir / f"{cmd.pod}.checkpoint"
    checkpoint_path.unlink(missing_ok=True)
    spec.env[CHECKPOINT_ENV] = str(checkpoint_path)
    _check_runnable(spec.argv[0], spec.env, pod_dir)  # a missing command is a start failure, as before
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(POD_LEADER), str(os.getpid()), str(lease_file or "-"),
            f"{fence_grace_s:g}", *spec.argv,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env=spec.env,
            cwd=pod_dir,
            start_new_session=True,
            preexec_fn=_preexec(spec.cpus),
        )
    finally:
        log_file.close()
    pod = PodProcess(cmd=cmd, proc=proc, log_path=log_path, cleanup_argv=spec.cleanup_argv, cpus=spec.cpus,
                     argv=spec.argv, checkpoint_path=checkpoint_path)

    async def wait() -> None:
        rc = await proc.wait()
        _killpg(proc.pid, signal.SIGKILL)  # reap anything the pod left behind in its group
        tail = _tail(log_path)
        limit_hit = False
        if at_limit is not None and rc != 0 and not pod.stopping:
            try:
                limit_hit = at_limit(pod)
            except Exception as exc:  # noqa: BLE001 - a failed probe must not lose the exit
                log.warning("oom_probe_failed", job_id=cmd.job_id, pod=cmd.pod, error=repr(exc))
        reason, sig = exit_reason(rc, pod.stopping, tail, at_limit=limit_hit)
        message = tail.decode(errors="replace").strip().splitlines()[-1][:200] if tail.strip() else ""
        if pod.fenced or pod_leader.FENCED.encode() in tail[-4096:]:
            reason, message = ExitReason.LOST, "fenced: the node lease ran out"  # not stopped on request
        if reason == ExitReason.OOM and limit_hit and not OOM_PATTERNS.search(tail):
            message = "GPU memory at its limit when the pod failed" + (f": {message}" if message else "")
        await on_exit(pod, rc, reason, sig, message if reason != ExitReason.COMPLETED else "")

    pod.waiter = asyncio.create_task(wait())
    return pod


def _check_runnable(program: str, env: dict[str, str], cwd: Path) -> None:
    """Raise the OSError exec would raise for ``program`` (the pod leader execs it only later)."""
    path = (cwd / program) if os.sep in program else shutil.which(program, path=env.get("PATH", os.defpath))
    if path is None or not Path(path).exists():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
    if Path(path).is_dir() or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, "Permission denied", program)


def _tail(path: Path, size: int = 16384) -> bytes:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - size))
        return f.read()
