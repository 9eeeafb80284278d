"""Small builders for tests."""

from __future__ import annotations

import sys
from typing import Any

from tide.schemas.node import GpuDescription, NodeDescription

PY = sys.executable


def small_node(node_id: str, gpus: int = 2, pool: str = "training", model: str = "A100-80GB") -> NodeDescription:
    return NodeDescription(
        node_id=node_id, cpu_milli=32_000, memory_mib=256 * 1024, labels={"pool": pool},
        gpus=[GpuDescription(index=i, model=model, memory_mib=81920, uuid=f"GPU-{node_id}-{i}") for i in range(gpus)],
    )


def job(name: str, command: list[str], replicas: int = 1, **resources: object) -> dict:
    """A job spec dict for tests."""
    spec: dict = {"replicas": replicas, "template": {"command": command, "resources": dict(resources)}}
    return {"metadata": {"name": name}, "spec": spec}


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def count_mgets(redis: Any) -> list[list[str]]:
    """The keys of each MGET made on ``redis`` from now on (the list fills as they are made)."""
    reads: list[list[str]] = []
    real_mget = redis.mget

    async def counted_mget(names: list[str]) -> list[str | None]:
        reads.append(list(names))
        return await real_mget(names)

    redis.mget = counted_mget
    return reads
