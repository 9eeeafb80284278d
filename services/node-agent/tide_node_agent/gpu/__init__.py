"""GPU backends behind one interface: simulated (from a node description) and NVML (pynvml).

``GpuBackend`` is the single seam between the agent and the GPUs. Both backends implement all of it;
the agent never asks which one it has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tide.core.mig import profiles_for
from tide.schemas.events import GpuSample
from tide.schemas.node import MigInstanceDescription, NodeDescription


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (e.g. NVML without a driver)."""


class MigError(RuntimeError):
    """A MIG request the GPU cannot honour: MIG mode off, a reset needed, a bad profile or placement."""


@dataclass(frozen=True, slots=True)
class PodGpus:
    """What the backend needs to know about a running pod (drives synthetic telemetry and OOM checks)."""

    key: str
    pid: int
    gpus: tuple[int, ...]
    """GPU indices the pod uses."""
    share: float = 1.0
    """the share of each GPU it holds (1.0 for whole GPUs and MIG instances)."""
    memory_limit_bytes: int = 0
    mig_uuid: str | None = None
    memory_file: str | None = field(default=None, compare=False)
    """simulated only: a file the pod may write a byte count into = the GPU memory it "allocates"."""


class GpuBackend(Protocol):
    def discover(self) -> NodeDescription:
        """The node's inventory: GPUs, models, memory, compute capability, MIG, NUMA/affinity, topology."""
        ...

    def sample(self, busy: dict[int, float]) -> list[GpuSample]:
        """Per-GPU telemetry now. ``busy`` maps GPU index -> share of it held by running pods."""
        ...

    def process_memory(self) -> dict[int, int]:
        """pid -> GPU memory in bytes, summed over every GPU/MIG device the process uses."""
        ...

    def pod_started(self, pod: PodGpus) -> None:
        """A pod began on these GPUs (the simulated backend drives its telemetry from this)."""
        ...

    def pod_exited(self, key: str) -> None: ...

    def mig_mode(self, gpu_index: int) -> bool:
        """Whether MIG mode is (currently, not pending) on."""
        ...

    def mig_instances(self, gpu_index: int) -> list[MigInstanceDescription]:
        """The MIG instances configured on a GPU now (with UUIDs)."""
        ...

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        """Switch MIG mode; raises MigError when the GPU cannot (not capable, or a reset would be needed)."""
        ...

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        """Create a GPU instance + compute instance of ``profile`` at memory slot ``start``; its MIG UUID."""
        ...

    def destroy_mig(self, gpu_index: int, uuid: str) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- helpers shared by both backends
def mig_profile_by_shape(model: str, compute: int, size: int) -> str | None:
    """The Tide profile name for an instance of ``compute`` slices over ``size`` memory slots."""
    for name, p in profiles_for(model).items():
        if p.compute == compute and p.size == size:
            return name
    return None


def derived_labels(node: NodeDescription) -> dict[str, str]:
    """Labels every node gets from its inventory (a job's nodeSelector can use them)."""
    if not node.gpus:
        return {"tide.gpu.count": "0"}
    models = sorted({g.model for g in node.gpus})
    return {
        "tide.gpu.model": models[0] if len(models) == 1 else "mixed",
        "tide.gpu.count": str(len(node.gpus)),
        "tide.gpu.memory-gib": str(min(g.memory_mib for g in node.gpus) // 1024),
        "tide.gpu.mig-capable": str(any(g.mig_capable for g in node.gpus)).lower(),
        "tide.gpu.nvlink": str(any(g.nvlink_peers or g.nvlink_domain is not None for g in node.gpus)).lower(),
    }


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` or a JSON object (TIDE_NODE_LABELS)."""
    import json

    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        data = json.loads(text)
        return {str(k): str(v) for k, v in data.items()}
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"TIDE_NODE_LABELS: {item!r} is not key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def with_labels(node: NodeDescription, extra: dict[str, str]) -> NodeDescription:
    """Derived labels, then the node's own (node file), then the configured ones (TIDE_NODE_LABELS)."""
    labels = {**derived_labels(node), **node.labels, **extra}
    return node.model_copy(update={"labels": labels})
