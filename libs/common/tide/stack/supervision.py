"""Supervision decisions (pure) and the health file that ``tide up`` keeps and ``tide health`` reads.

A process that exits without being asked to is restarted after a backoff: 0.5 s, doubling per crash in
a row up to 30 s; a process that stayed up for 60 s before it crashed starts the series again.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
BACKOFF_RESET_AFTER_S = 60.0
HEALTH_FILE = "health.json"
STALE_AFTER_S = 10.0  # a health file older than this means nobody supervises the stack any more


def backoff_s(crashes_in_a_row: int, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S) -> float:
    """The wait before the restart that follows the ``crashes_in_a_row``-th crash in a row (1, 2, ...)."""
    if crashes_in_a_row < 1:
        return 0.0
    return min(cap_s, base_s * 2 ** min(crashes_in_a_row - 1, 32))


def crashes_in_a_row(previous: int, uptime_s: float, reset_after_s: float = BACKOFF_RESET_AFTER_S) -> int:
    """The crash count after one more crash: a process that ran ``reset_after_s`` or longer starts again at 1."""
    return 1 if uptime_s >= reset_after_s else previous + 1


@dataclass
class ProcessHealth:
    """One supervised process as ``health.json`` shows it. ``state``: running, restarting (waiting out
    its backoff), stopped (stopped on purpose) or exited (gone and not being restarted)."""

    name: str
    pid: int | None
    state: str
    started_at: float | None
    restarts: int = 0
    last_exit: int | None = None
    crashes_in_a_row: int = 0
    restart_at: float | None = None


def health_document(processes: list[ProcessHealth], supervisor_pid: int, now: float) -> dict[str, Any]:
    return {
        "updated_at": now,
        "supervisor_pid": supervisor_pid,
        "processes": [asdict(p) for p in processes],
    }


def write_health(home: Path, document: dict[str, Any]) -> None:
    """Replace the file atomically, so a reader never sees half of it."""
    path = home / HEALTH_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2))
    os.replace(tmp, path)


def read_health(home: Path) -> dict[str, Any] | None:
    try:
        return json.loads((home / HEALTH_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


@dataclass
class HealthRow:
    name: str
    state: str
    pid: int | None
    uptime_s: float | None
    restarts: int
    last_exit: int | None


def health_rows(document: dict[str, Any], alive: dict[int, bool], now: float) -> tuple[list[HealthRow], bool]:
    """What ``tide health`` prints, and whether every process is up. ``alive`` says, per pid, whether it
    runs now; a stale document (no supervisor writing it) counts as down."""
    stale = now - float(document.get("updated_at", 0)) > STALE_AFTER_S
    rows: list[HealthRow] = []
    healthy = not stale
    for p in document.get("processes", []):
        state = p["state"]
        if state == "running" and (p["pid"] is None or not alive.get(p["pid"], False)):
            state = "down"
        if stale and state == "running":
            state = "unsupervised"
        if state != "running":
            healthy = False
        uptime = now - p["started_at"] if state in ("running", "unsupervised") and p["started_at"] else None
        rows.append(HealthRow(p["name"], state, p["pid"], uptime, p["restarts"], p["last_exit"]))
    return rows, healthy


def format_uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def now_s() -> float:
    return time.time()
