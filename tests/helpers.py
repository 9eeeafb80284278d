"""Small builders for tests."""

from __future__ import annotations

import sys

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
