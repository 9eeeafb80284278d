"""Node descriptions: what a node has (simulated backend, tests, trace loaders, inventory)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

NODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
NodeId = Annotated[str, Field(pattern=NODE_ID_PATTERN, description="subject-safe node id")]


class MigInstanceDescription(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str
    start: int = Field(ge=0, le=7, description="first memory slot of the instance")
    uuid: str | None = None


class GpuDescription(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0)
    model: str = Field(description="GPU model, e.g. H100-80GB, A100-40GB, T4, V100M16")
    memory_mib: int = Field(gt=0)
    uuid: str | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_instances: list[MigInstanceDescription] = Field(default_factory=list)
    pcie_switch: int = Field(default=0, ge=0, description="PCIe switch id within the node")
    numa_node: int = Field(default=0, ge=0)
    nvlink_domain: int | None = Field(default=None, description="NVSwitch/NVLink domain id within the node")
    nvlink_peers: list[int] = Field(default_factory=list, description="indices of directly NVLinked GPUs")
    # discovered by the node agent (optional; node files may leave them out)
    compute_capability: str | None = Field(default=None, description="CUDA compute capability, e.g. '9.0'")
    pci_bus_id: str | None = Field(default=None, description="PCIe bus id, e.g. '00000000:18:00.0'")
    cpu_affinity: list[int] = Field(default_factory=list, description="CPUs local to the GPU (its NUMA node)")
    topology: dict[int, str] = Field(
        default_factory=dict,
        description="peer GPU index -> link: nvlink | pcie_switch | pcie_multi_switch | root_complex | "
        "same_numa | cross_socket (nvmlDeviceGetTopologyCommonAncestor)",
    )


class NodeDescription(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node_id: NodeId
    cpu_milli: int = Field(gt=0)
    memory_mib: int = Field(gt=0)
    numa_nodes: int = Field(default=1, ge=1)
    rack: str = "rack-0"
    spine: str = "spine-0"
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuDescription] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_gpu_indices(self) -> NodeDescription:
        indices = [g.index for g in self.gpus]
        if sorted(indices) != list(range(len(indices))):
            raise ValueError(f"gpu indices must be 0..{len(indices) - 1} without gaps, got {indices}")
        return self

    @property
    def pool(self) -> str | None:
        return self.labels.get("pool")


def default_h100_node(node_id: str, pool: str = "training", rack: str = "rack-0") -> NodeDescription:
    """8 x H100-80GB on one NVSwitch, 2 NUMA nodes, 4 PCIe switches, 112 CPUs, 2 TiB memory."""
    gpus = [
        GpuDescription(
            index=i,
            model="H100-80GB",
            memory_mib=81559,
            uuid=f"GPU-{node_id}-{i:02d}",
            mig_capable=True,
            pcie_switch=i // 2,
            numa_node=i // 4,
            nvlink_domain=0,
            nvlink_peers=[j for j in range(8) if j != i],
        )
        for i in range(8)
    ]
    return NodeDescription(
        node_id=node_id,
        cpu_milli=112_000,
        memory_mib=2 * 1024 * 1024,
        numa_nodes=2,
        rack=rack,
        labels={"pool": pool},
        gpus=gpus,
    )


class ClusterDescription(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[NodeDescription]

    @model_validator(mode="after")
    def _unique_ids(self) -> ClusterDescription:
        ids = [n.node_id for n in self.nodes]
        if len(ids) != len(set(ids)):
            raise ValueError("node ids must be unique")
        return self


def load_node_file(path: str | Path) -> list[NodeDescription]:
    """Read a YAML/JSON node file: a list of nodes or ``{nodes: [...]}``."""
    data = yaml.safe_load(Path(path).read_text())
    if isinstance(data, list):
        data = {"nodes": data}
    return ClusterDescription.model_validate(data).nodes
