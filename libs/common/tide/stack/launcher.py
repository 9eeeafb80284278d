"""``tide up``: NATS (JetStream), Redis, the four services and N simulated node agents on one machine.

Every process is started in its own session so that a detached stack outlives the CLI; its
pids, endpoints and generated credentials are written to ``<home>/stack.json`` (mode 0600).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tide import subjects
from tide.bus.nats import connect
from tide.schemas.node import ClusterDescription, NodeDescription, default_h100_node, load_node_file
from tide.settings import Settings
from tide.stack.auth import SERVICES, nats_config, new_password, node_user, redis_acl_lines
from tide.stack.servers import (
    StackError,
    free_port,
    nats_server_binary,
    redis_config,
    redis_server_binary,
    wait_tcp,
)

HOST = "127.0.0.1"
SERVICE_MODULES = {"queue": "tide_queue", "placer": "tide_placer", "metrics": "tide_metrics"}


def default_home() -> Path:
    return Path(os.environ.get("TIDE_HOME", Path.home() / ".tide"))


@dataclass
class StackInfo:
    home: str
    nats_url: str
    redis_host: str
    redis_port: int
    metrics_url: str
    passwords: dict[str, str]
    node_ids: list[str]
    pids: dict[str, int] = field(default_factory=dict)

    def redis_url(self, user: str) -> str:
        return f"redis://{user}:{self.passwords[user]}@{self.redis_host}:{self.redis_port}/0"

    def settings_for(self, user: str, **extra: object) -> Settings:
        return Settings(
            nats_url=self.nats_url,
            nats_user=user,
            nats_password=self.passwords[user],
            redis_url=self.redis_url(user) if user in SERVICES else "",
            **extra,
        )

    def env_for(self, user: str) -> dict[str, str]:
        env = {
            "TIDE_NATS_URL": self.nats_url,
            "TIDE_NATS_USER": user,
            "TIDE_NATS_PASSWORD": self.passwords[user],
        }
        if user in SERVICES:
            env["TIDE_REDIS_URL"] = self.redis_url(user)
        return env

    def save(self) -> None:
        path = Path(self.home) / "stack.json"
        path.write_text(json.dumps(asdict(self), indent=2))
        path.chmod(0o600)

    @classmethod
    def load(cls, home: Path) -> StackInfo:
        path = home / "stack.json"
        if not path.exists():
            raise StackError(f"no stack in {home} (start one with `tide up`, or set TIDE_NATS_URL/USER/PASSWORD)")
        return cls(**json.loads(path.read_text()))


def _alive(pid: int) -> bool:
    """True while the process runs (a zombie nobody reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stack_running(home: Path) -> bool:
    try:
        info = StackInfo.load(home)
    except StackError:
        return False
    return any(_alive(pid) for pid in info.pids.values())


def cluster_nodes(nodes: int, node_file: Path | None) -> list[NodeDescription]:
    if node_file is not None:
        return load_node_file(node_file)
    return [default_h100_node(f"node-{i}") for i in range(nodes)]


class Stack:
    """Starts and stops the whole stack; one instance per ``tide up``."""

    def __init__(
        self,
        home: Path,
        nodes: list[NodeDescription],
        log_format: str = "json",
        placers: int = 1,
        env: dict[str, dict[str, str]] | None = None,
        start_agents: bool = True,
    ) -> None:
        """``placers`` > 1 runs several placer processes (placer, placer-2, ...) on one cluster;
        ``env`` adds environment variables per process name (e.g. settings for one service);
        ``start_agents=False`` creates the nodes' credentials but leaves running their agents to the caller
        (benchmarks that multiplex simulated agents)."""
        self.start_agents = start_agents
        self.home = home
        self.nodes = nodes
        self.log_format = log_format
        self.services = ["queue", "metrics", "placer", *[f"placer-{i}" for i in range(2, placers + 1)]]
        self.extra_env = env or {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.argv: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.info: StackInfo | None = None

    # ------------------------------------------------------------ start
    def start(self, timeout_s: float = 60.0) -> StackInfo:
        if stack_running(self.home):
            raise StackError(f"a stack is already running in {self.home}: `tide down` first")
        for sub in ("logs", "run", "nats", "redis", "agents"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        for ready in (self.home / "run").glob("*.ready"):
            ready.unlink()
        node_ids = [n.node_id for n in self.nodes]
        passwords = {name: new_password() for name in (*SERVICES, "admin")}
        passwords.update({node_user(n): new_password() for n in node_ids})
        nats_port, redis_port, metrics_port = free_port(), free_port(), free_port()
        node_file = self.home / "nodes.yaml"
        node_file.write_text(yaml.safe_dump(ClusterDescription(nodes=self.nodes).model_dump(mode="json")))
        self.info = info = StackInfo(
            home=str(self.home),
            nats_url=f"nats://{HOST}:{nats_port}",
            redis_host=HOST,
            redis_port=redis_port,
            metrics_url=f"http://{HOST}:{metrics_port}/metrics",
            passwords=passwords,
            node_ids=node_ids,
        )
        try:
            self._start_servers(info, nats_port, redis_port)
            base = {"TIDE_LOG_FORMAT": self.log_format}
            for name in self.services:
                user = service_user(name)
                env = {**base, **info.env_for(user), "TIDE_READY_FILE": str(self.home / "run" / f"{name}.ready")}
                if name == "metrics":
                    env["TIDE_METRICS_PORT"] = str(metrics_port)
                env.update(self.extra_env.get(name, {}))
                self._spawn(name, [sys.executable, "-m", SERVICE_MODULES[user]], env)
            self._wait_ready_files(tuple(self.services), timeout_s)
            for node_id in node_ids if self.start_agents else []:
                env = {
                    **base,
                    **info.env_for(node_user(node_id)),
                    "TIDE_NODE_ID": node_id,
                    "TIDE_NODE_FILE": str(node_file),
                    "TIDE_WORK_DIR": str(self.home / "agents"),
                    **self.extra_env.get("agents", {}),  # every agent
                    **self.extra_env.get(f"agent-{node_id}", {}),
                }
                self._spawn(f"agent-{node_id}", [sys.executable, "-m", "tide_node_agent"], env)
            if self.start_agents:
                run_blocking(wait_for_nodes(info, len(node_ids), timeout_s))
        except BaseException:
            self.stop()
            raise
        info.pids = {name: p.pid for name, p in self.procs.items()}
        info.save()
        return info

    def _start_servers(self, info: StackInfo, nats_port: int, redis_port: int) -> None:
        conf = self.home / "nats" / "nats.conf"
        conf.write_text(
            nats_config(nats_port, str(self.home / "nats" / "store"), info.passwords, info.node_ids, HOST)
        )
        conf.chmod(0o600)
        self._spawn("nats", [nats_server_binary(), "-c", str(conf)], {})
        rconf = self.home / "redis" / "redis.conf"
        rconf.write_text(redis_config(redis_port, str(self.home / "redis"), redis_acl_lines(info.passwords), HOST))
        rconf.chmod(0o600)
        self._spawn("redis", [redis_server_binary(), str(rconf)], {})
        wait_tcp(HOST, nats_port)
        wait_tcp(HOST, redis_port)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.argv[name] = (argv, env)
        log = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **env}, start_new_session=True,
        )
        log.close()

    def _wait_ready_files(self, names: tuple[str, ...], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for name in names:
            ready = self.home / "run" / f"{name}.ready"
            while not ready.exists():
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise StackError(f"{name} exited with {proc.returncode}; see {self.home}/logs/{name}.log")
                if time.monotonic() > deadline:
                    raise StackError(f"{name} not ready after {timeout_s}s; see {self.home}/logs/{name}.log")
                time.sleep(0.05)

    # ------------------------------------------------------------ one part
    def kill(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int:
        """Signal one process (e.g. to test a crash) and wait for it to exit; returns its exit code."""
        proc = self.procs[name]
        proc.send_signal(sig)
        return proc.wait(timeout=timeout_s)

    def restart(self, name: str, timeout_s: float = 30.0, env: dict[str, str] | None = None) -> None:
        """Start a stopped process again with the same command and environment (plus ``env``)."""
        argv, old_env = self.argv[name]
        if name in self.services:
            (self.home / "run" / f"{name}.ready").unlink(missing_ok=True)
        self._spawn(name, argv, {**old_env, **(env or {})})
        if name in self.services:
            self._wait_ready_files((name,), timeout_s)
        if self.info is not None:
            self.info.pids[name] = self.procs[name].pid
            self.info.save()

    # ------------------------------------------------------------ stop
    def stop(self) -> None:
        stop_pids({name: p.pid for name, p in self.procs.items()})
        for p in self.procs.values():
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        stack_json = self.home / "stack.json"
        if stack_json.exists():
            stack_json.unlink()


def run_blocking(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to completion from synchronous code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, coro).result()


def service_user(name: str) -> str:
    """The credentials a process uses: extra placers (placer-2, ...) are the placer."""
    return name.split("-", 1)[0] if name.startswith("placer-") else name


def stop_pids(pids: dict[str, int], grace_s: float = 10.0) -> None:
    """Stop agents and services first (they drain), then Redis and NATS."""
    servers = [n for n in ("redis", "nats") if n in pids]
    order = [n for n in pids if n.startswith("agent-")] + [n for n in pids if n not in servers and
                                                             not n.startswith("agent-")] + servers
    for group in (order[:-2], order[-2:]):
        for name in group:
            try:
                os.kill(pids[name], signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        for name in group:
            while _alive(pids[name]) and not _reaped(pids[name]) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pids[name]) and not _reaped(pids[name]):
                try:
                    os.kill(pids[name], signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _reaped(pid: int) -> bool:
    """Reap a child of ours if it has exited (True when it is gone)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return not _alive(pid)


def down(home: Path) -> bool:
    try:
        info = StackInfo.load(home)
    except StackError:
        return False
    stop_pids(info.pids)
    (home / "stack.json").unlink(missing_ok=True)
    return True


async def wait_for_nodes(info: StackInfo, count: int, timeout_s: float) -> None:
    """Ready means: the placer knows every node agent."""
    nc = await connect(info.settings_for("admin"), "tide-up")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = await nc.request(subjects.API_NODES, b"{}", timeout=2)
                if len(json.loads(reply.data)["nodes"]) >= count:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise StackError(f"not all {count} node agents registered after {timeout_s}s")
            await asyncio.sleep(0.1)
    finally:
        await nc.close()
