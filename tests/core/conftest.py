from __future__ import annotations

import pytest
from tide.schemas.node import GpuDescription, NodeDescription, default_h100_node


def gpu_node(node_id: str, model: str = "T4", n: int = 2, cpu: int = 32000, mem: int = 65536,
             gpu_mem: int = 15000, labels: dict[str, str] | None = None, mig: bool = False) -> NodeDescription:
    return NodeDescription(
        node_id=node_id,
        cpu_milli=cpu,
        memory_mib=mem,
        labels=labels or {"pool": "training"},
        gpus=[GpuDescription(index=i, model=model, memory_mib=gpu_mem, mig_capable=mig, pcie_switch=i // 2,
                             numa_node=i // 4) for i in range(n)],
    )


@pytest.fixture
def small_nodes() -> list[NodeDescription]:
    return [
        gpu_node("t4-a", "T4", 2),
        gpu_node("t4-b", "T4", 4, labels={"pool": "inference"}),
        gpu_node("v100", "V100M32", 8, cpu=96000, mem=393216, gpu_mem=32510),
        default_h100_node("h100", pool="training"),
        NodeDescription(node_id="cpu-only", cpu_milli=64000, memory_mib=131072),
    ]
