"""Loaders for the openb trace (alibaba/clusterdata cluster-trace-gpu-v2023).

Nodes become NodeDescriptions with a synthesised topology: racks of ``RACK_SIZE`` consecutive nodes,
``RACKS_PER_SPINE`` racks per spine; GPUs 2 per PCIe switch, half the GPUs per NUMA node, and one
NVLink domain per node for the V100 and G3 (8-GPU SXM) models. The trace gives no GPU memory, so
memory per model comes from ``GPU_MEMORY_MIB`` (published sizes; undisclosed G1-G3 get 32 GiB
defaults); none of the openb models is MIG-capable. A share in openb is milli-GPU only.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from tide.core.model import MILLI, PodRequest
from tide.schemas.node import GpuDescription, NodeDescription

RACK_SIZE = 16
RACKS_PER_SPINE = 8
GPU_MEMORY_MIB: dict[str, int] = {
    "T4": 15109,
    "P100": 16280,
    "V100M16": 16160,
    "V100M32": 32510,
    "A10": 22731,
    "G1": 32768,
    "G2": 32768,
    "G3": 32768,
}
DEFAULT_GPU_MEMORY_MIB = 16384
NVLINK_MODELS = frozenset({"V100M16", "V100M32", "G3"})


def load_nodes(path: str | Path) -> list[NodeDescription]:
    nodes: list[NodeDescription] = []
    with open(path, newline="") as f:
        for k, row in enumerate(csv.DictReader(f)):
            ngpu = int(row.get("gpu") or 0)
            model = (row.get("model") or "").strip()
            gpus = [
                GpuDescription(
                    index=i,
                    model=model,
                    memory_mib=GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB),
                    pcie_switch=i // 2,
                    numa_node=0 if ngpu < 2 else i // max(ngpu // 2, 1),
                    nvlink_domain=0 if model in NVLINK_MODELS and ngpu > 1 else None,
                )
                for i in range(ngpu)
            ]
            rack = k // RACK_SIZE
            nodes.append(
                NodeDescription(
                    node_id=row["sn"],
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    numa_nodes=2 if ngpu >= 2 else 1,
                    rack=f"rack-{rack}",
                    spine=f"spine-{rack // RACKS_PER_SPINE}",
                    labels={"pool": "openb", "gpu-model": model} if model else {"pool": "openb"},
                    gpus=gpus,
                )
            )
    return nodes


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    request: PodRequest


def load_pods(path: str | Path) -> list[TracePod]:
    """Pods of a trace file; works with the 5-column multigpu files too (no gpu_spec there)."""
    pods: list[TracePod] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            num_gpu = int(row.get("num_gpu") or 0)
            milli = int(row.get("gpu_milli") or 0)
            spec = (row.get("gpu_spec") or "").strip()
            models = tuple(sorted({m for m in spec.split("|") if m})) if num_gpu else ()
            share = num_gpu == 1 and 0 < milli < MILLI
            req = PodRequest(
                cpu_milli=int(row.get("cpu_milli") or 0),
                memory_mib=int(row.get("memory_mib") or 0),
                gpu_count=0 if share or num_gpu == 0 else num_gpu,
                gpu_milli=milli if share else 0,
                gpu_models=models,
            )
            pods.append(TracePod(row["name"], req))
    return pods
