"""A simulated NVML: inventory from a node description, telemetry driven by the running pods."""

from __future__ import annotations

import random

from tide.schemas.events import GpuSample
from tide.schemas.node import NodeDescription

MIB = 1024 * 1024


class SimulatedBackend:
    def __init__(self, node: NodeDescription, seed: int = 0) -> None:
        self.node = node
        self._rng = random.Random(seed)

    def discover(self) -> NodeDescription:
        return self.node

    def sample(self, busy: dict[int, float]) -> list[GpuSample]:
        out = []
        for gpu in self.node.gpus:
            load = min(1.0, busy.get(gpu.index, 0.0))
            jitter = self._rng.uniform(0.9, 1.0) if load else 0.0
            total = gpu.memory_mib * MIB
            out.append(
                GpuSample(
                    index=gpu.index,
                    uuid=gpu.uuid or f"GPU-{self.node.node_id}-{gpu.index}",
                    utilization_ratio=round(load * jitter, 3),
                    memory_used_bytes=int(total * load * 0.8),
                    memory_total_bytes=total,
                    memory_bandwidth_ratio=round(load * jitter * 0.6, 3),
                    pcie_tx_bytes_per_s=load * 2e9,
                    pcie_rx_bytes_per_s=load * 3e9,
                    sm_clock_hz=1.98e9 if load else 3.45e8,
                    power_watts=70 + 630 * load,
                    temperature_c=30 + 45 * load,
                )
            )
        return out
