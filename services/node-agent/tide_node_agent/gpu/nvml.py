"""The real NVML backend through pynvml (nvidia-ml-py). It never falls back to simulation."""

from __future__ import annotations

from tide.schemas.events import GpuSample
from tide.schemas.node import GpuDescription, NodeDescription

from tide_node_agent.gpu import BackendUnavailable


def _nvml():  # imported lazily so the simulated backend never needs the library
    import pynvml

    return pynvml


class NvmlBackend:
    def __init__(self, node_id: str, labels: dict[str, str] | None = None) -> None:
        pynvml = _nvml()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(
                f"NVML is not available on this machine ({exc}); install the NVIDIA driver, "
                "or run the agent with TIDE_NVML_BACKEND=simulated and a node file"
            ) from exc
        self.node_id = node_id
        self.labels = labels or {}

    def discover(self) -> NodeDescription:
        import os

        pynvml = _nvml()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
                mig_capable, mig_enabled = True, bool(current)
            except pynvml.NVMLError:
                mig_capable, mig_enabled = False, False
            gpus.append(
                GpuDescription(
                    index=i,
                    model=str(pynvml.nvmlDeviceGetName(h)),
                    memory_mib=int(mem.total // (1024 * 1024)),
                    uuid=str(pynvml.nvmlDeviceGetUUID(h)),
                    mig_capable=mig_capable,
                    mig_enabled=mig_enabled,
                )
            )
        return NodeDescription(
            node_id=self.node_id,
            cpu_milli=(os.cpu_count() or 1) * 1000,
            memory_mib=int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)),
            labels=self.labels,
            gpus=gpus,
        )

    def sample(self, busy: dict[int, float]) -> list[GpuSample]:
        pynvml = _nvml()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append(
                GpuSample(
                    index=i,
                    uuid=str(pynvml.nvmlDeviceGetUUID(h)),
                    utilization_ratio=util.gpu / 100.0,
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                    memory_bandwidth_ratio=util.memory / 100.0,
                )
            )
        return out
