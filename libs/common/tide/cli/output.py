"""Output formats for the list commands (`-o table|wide|json|yaml`) and their columns (pure)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

FORMATS = ("table", "wide", "json", "yaml")


def duration(seconds: float | None) -> str:
    """kubectl-style ages: 45s, 12m, 3h20m, 5d."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 48 * 3600:
        h, m = divmod(s // 60, 60)
        return f"{h}h{m}m" if m else f"{h}h"
    return f"{s // 86400}d"


def job_gpus(spec: dict[str, Any]) -> str:
    """What the job asks for in GPUs: ``16`` whole GPUs, ``4x1g.10gb`` MIG, ``2x30%`` shares, ``0``."""
    body = spec.get("spec", {})
    res = body.get("template", {}).get("resources", {})
    replicas = int(body.get("replicas", 1))
    if res.get("gpu"):
        return str(replicas * int(res["gpu"]))
    if res.get("mig"):
        return f"{replicas}x{res['mig']}"
    share = res.get("gpuShare")
    if share:
        return f"{replicas}x{share['smPercent']}%"
    return "0"


def job_row(record: dict[str, Any], summary: dict[str, Any], now: float) -> dict[str, Any]:
    """The summary plus the derived columns: gpus, age, elapsed, nodes."""
    started, finished = summary.get("started_at"), summary.get("finished_at")
    elapsed = (finished or now) - started if started else None
    nodes = sorted({p["node"] for p in summary["pods"] if p.get("node")})
    return {**summary, "gpus": job_gpus(record["spec"]), "age": duration(now - summary["submitted_at"]),
            "elapsed": duration(elapsed), "nodes": nodes}


def filter_jobs(rows: list[dict[str, Any]], states: Sequence[str] = (), queues: Sequence[str] = ()) -> list[dict]:
    """Jobs in any of ``states`` and any of ``queues`` (a queue matches itself and its sub-queues)."""
    def queue_ok(q: str) -> bool:
        return not queues or any(q == want or q.startswith(want.rstrip("/") + "/") for want in queues)

    return [r for r in rows if (not states or r["state"] in states) and queue_ok(r["queue"])]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Left-aligned columns two spaces apart (the last one unpadded)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = []
    for row in [headers, *cells]:
        padded = [c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def dump(data: Any, fmt: str) -> str:
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip()
    return json.dumps(data)


def jobs_table(rows: list[dict[str, Any]], wide: bool) -> str:
    if wide:
        headers = ["JOB", "STATE", "QUEUE", "PRIORITY", "GPUS", "PODS", "AGE", "ELAPSED", "ATTEMPTS", "NODES",
                   "REASON"]
        body = [[r["job_id"], r["state"], r["queue"], r["priority_class"], r["gpus"], len(r["pods"]), r["age"],
                 r["elapsed"], r["attempts"], ",".join(r["nodes"]) or "-", r["reason"]] for r in rows]
    else:
        headers = ["JOB", "STATE", "QUEUE", "GPUS", "AGE", "ELAPSED", "REASON"]
        body = [[r["job_id"], r["state"], r["queue"], r["gpus"], r["age"], r["elapsed"], r["reason"]] for r in rows]
    return table(headers, body)


def nodes_wide(nodes: list[dict[str, Any]]) -> str:
    headers = ["NODE", "POOL", "RACK", "GPUS", "USED", "MODELS", "CPU", "CPU USED", "LABELS", "LOST", "SEEN"]
    rows = []
    for n in nodes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(n["labels"].items()) if not k.startswith("tide.")) or "-"
        seen = f"{n['last_seen_s']}s ago" if n["last_seen_s"] is not None else "-"
        rows.append([n["node_id"], n["labels"].get("pool", "-"), n["rack"], n["gpus"],
                     f"{n['gpus_used_milli'] / 1000:.2f}", ",".join(n["gpu_models"]), f"{n['cpu_milli']}m",
                     f"{n['cpu_used_milli']}m", labels, "yes" if n.get("lost") else "no", seen])
    return table(headers, rows)
