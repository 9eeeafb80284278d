"""GPU backends behind one interface: simulated (from a node description) and NVML (pynvml)."""

from __future__ import annotations

from typing import Protocol

from tide.schemas.events import GpuSample
from tide.schemas.node import NodeDescription


class GpuBackend(Protocol):
    def discover(self) -> NodeDescription:
        """The node's inventory: GPUs, models, memory, MIG, topology."""
        ...

    def sample(self, busy: dict[int, float]) -> list[GpuSample]:
        """Per-GPU telemetry now. ``busy`` maps GPU index -> share of it held by running pods."""
        ...


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (e.g. NVML without a driver)."""
