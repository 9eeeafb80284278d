"""Pod logs over NATS: the agent answers ``tide.node.<id>.logs`` from ``<work_dir>/<job>/<pod>.log``.

Request (JSON): ``{"job_id": J}`` lists the job's log files on this node; with ``"pod": "<name>.a<attempt>"``
it reads one, from ``offset`` (or from the start of the last ``tail_lines`` lines), at most ``limit`` bytes
(capped at ``MAX_CHUNK_BYTES`` so one reply stays well under NATS's max_payload). Replies:

- list: ``{"ok": true, "node_id", "pods": [{"pod", "name", "attempt", "size", "running"}]}``
- read: ``{"ok": true, "pod", "offset", "next_offset", "size", "running", "data": <base64>}``
- error: ``{"ok": false, "error": "..."}``

Files outlive their pods, so finished pods (and earlier attempts) can be read too. Names are checked
before any path is built: a request cannot reach outside the work dir.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tide.schemas.events import JOB_ID_PATTERN, parse_agent_pod_id

MAX_CHUNK_BYTES = 64 * 1024
TAIL_SCAN_BYTES = 8 * 1024 * 1024
"""``tail_lines`` looks back at most this far (a file of very long lines starts its tail there)."""
POD_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")
JOB_PATTERN = re.compile(JOB_ID_PATTERN)


class LogRequestError(ValueError):
    pass


def answer(work_dir: Path, node_id: str, running: Collection[str], data: bytes) -> dict[str, Any]:
    """The reply to one logs request (``running``: the ``<job>/<pod>`` keys of the pods running now)."""
    try:
        req = json.loads(data or b"{}")
        if not isinstance(req, dict):
            raise LogRequestError("the request must be a JSON object")
        job_id = req.get("job_id")
        if not isinstance(job_id, str) or not JOB_PATTERN.match(job_id):
            raise LogRequestError(f"bad job_id {job_id!r}")
        pod = req.get("pod")
        if pod is None:
            return {"ok": True, "node_id": node_id, "pods": list_logs(work_dir, job_id, running)}
        if not isinstance(pod, str) or not POD_PATTERN.match(pod):
            raise LogRequestError(f"bad pod {pod!r}")
        offset, limit, tail = req.get("offset", 0), req.get("limit", MAX_CHUNK_BYTES), req.get("tail_lines")
        if not isinstance(offset, int) or offset < 0 or not isinstance(limit, int) or limit <= 0:
            raise LogRequestError("offset must be >= 0 and limit > 0")
        if tail is not None and (not isinstance(tail, int) or tail < 0):
            raise LogRequestError("tail_lines must be >= 0")
        return {"ok": True, **read_log(work_dir, job_id, pod, offset, limit, tail, f"{job_id}/{pod}" in running)}
    except (LogRequestError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        return {"ok": False, "error": str(exc)}
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc.strerror or exc}"}


def list_logs(work_dir: Path, job_id: str, running: Collection[str]) -> list[dict[str, Any]]:
    job_dir = work_dir / job_id
    if not job_dir.is_dir():
        return []
    found = []
    for path in sorted(job_dir.glob("*.log")):
        pod = path.name.removesuffix(".log")
        name, attempt = parse_agent_pod_id(pod)
        found.append({"pod": pod, "name": name, "attempt": attempt, "size": path.stat().st_size,
                      "running": f"{job_id}/{pod}" in running})
    return found


def read_log(work_dir: Path, job_id: str, pod: str, offset: int, limit: int, tail_lines: int | None,
             running: bool) -> dict[str, Any]:
    path = work_dir / job_id / f"{pod}.log"
    if not path.is_file():
        raise LogRequestError(f"no log for pod {pod} of job {job_id} on this node")
    limit = min(limit, MAX_CHUNK_BYTES)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if tail_lines is not None:
            offset = tail_offset(f, size, tail_lines)
        offset = min(offset, size)
        f.seek(offset)
        chunk = f.read(limit)
    return {"pod": pod, "offset": offset, "next_offset": offset + len(chunk), "size": size, "running": running,
            "data": base64.b64encode(chunk).decode()}


def tail_offset(f: Any, size: int, lines: int, block: int = 64 * 1024) -> int:
    """Where the last ``lines`` lines of an open binary file of ``size`` bytes start (a final line without
    a newline counts as a line); at most ``TAIL_SCAN_BYTES`` back."""
    if lines == 0:
        return size
    pos = size
    if size:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            pos = size - 1  # the file's last newline ends the last line, it does not start one
    floor = max(0, size - TAIL_SCAN_BYTES)
    seen = 0
    while pos > floor:
        start = max(floor, pos - block)
        f.seek(start)
        data = f.read(pos - start)
        i = len(data)
        while (i := data.rfind(b"\n", 0, i)) >= 0:
            seen += 1
            if seen == lines:
                return start + i + 1
        pos = start
    return floor
