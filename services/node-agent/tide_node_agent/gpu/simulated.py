"""A simulated NVML: inventory from a node description, MIG state and rules, telemetry driven by the pods.

Everything NVML would answer comes from the ``NodeDescription`` (models, memory, MIG instances,
NUMA, PCIe switches, NVLink) plus what the agent tells it (``pod_started``/``pod_exited``). The
telemetry is synthetic but deterministic for a seed: idle GPUs read zero, busy ones scale with the
share of the GPU the pods hold, NVLink traffic appears only for pods that span several GPUs.

A pod can make its GPU memory visible to the simulator by writing a byte count (per GPU) into the
file named by ``$TIDE_SIM_GPU_MEMORY_FILE``; it is capped at the pod's memory limit, as a real
allocator would be. That is how tests drive "at its memory limit" OOM detection without a GPU.
"""

from __future__ import annotations

import random
import uuid as uuidlib
from pathlib import Path

import structlog
from tide.core.mig import MIG_COMPUTE_SLICES, MIG_MEMORY_SLOTS, profiles_for
from tide.schemas.events import GpuSample, ProcessSample
from tide.schemas.node import GpuDescription, MigInstanceDescription, NodeDescription

from tide_node_agent.gpu import MigError, PodGpus

log = structlog.get_logger()

MIB = 1024 * 1024
_NS = uuidlib.UUID("5b1c3a52-54f4-4d57-9a5c-1f0f0c7e7a11")


def _compute_capability(model: str) -> str:
    for prefix, cc in (("H200", "9.0"), ("H100", "9.0"), ("A100", "8.0"), ("A30", "8.0"), ("L40", "8.9"),
                       ("L4", "8.9"), ("A10", "8.6"), ("T4", "7.5"), ("V100", "7.0")):
        if model.startswith(prefix):
            return cc
    return "8.0"


def _link(a: GpuDescription, b: GpuDescription) -> str:
    """The same classes nvmlDeviceGetTopologyCommonAncestor gives, from the description's fields."""
    if b.index in a.nvlink_peers or (a.nvlink_domain is not None and a.nvlink_domain == b.nvlink_domain):
        return "nvlink"
    if a.pcie_switch == b.pcie_switch:
        return "pcie_switch"
    if a.numa_node == b.numa_node:
        return "same_numa"
    return "cross_socket"


class SimulatedBackend:
    def __init__(self, node: NodeDescription, seed: int = 0, reset_required: set[int] | None = None) -> None:
        self._rng = random.Random(seed)
        self.reset_required = set(reset_required or ())
        """GPU indices whose MIG mode change would need a GPU reset (as on some A100 platforms)."""
        cpus = max(1, node.cpu_milli // 1000)
        per_numa = max(1, cpus // node.numa_nodes)
        gpus = []
        for g in node.gpus:
            gpus.append(g.model_copy(update={
                "uuid": g.uuid or f"GPU-{node.node_id}-{g.index}",
                "compute_capability": g.compute_capability or _compute_capability(g.model),
                "pci_bus_id": g.pci_bus_id or f"00000000:{0x18 + 0x10 * g.index:02X}:00.0",
                "cpu_affinity": g.cpu_affinity or list(range(g.numa_node * per_numa, (g.numa_node + 1) * per_numa)),
                "mig_instances": [
                    mi if mi.uuid else mi.model_copy(update={"uuid": self._mig_uuid(g, mi.profile, mi.start, 0)})
                    for mi in g.mig_instances
                ],
            }))
        for g in gpus:
            g.topology = {h.index: _link(g, h) for h in gpus if h.index != g.index}
        self.node = node.model_copy(update={"gpus": gpus})
        self.pods: dict[str, PodGpus] = {}
        self._xids: dict[int, list[int]] = {}
        self.ecc_uncorrected: dict[int, int] = {}
        self._generation = 0
        self.mig_log: list[tuple[str, int, str]] = []
        """(action, gpu index, detail) of every MIG change, for tests and logs."""

    # ------------------------------------------------------------ inventory
    def discover(self) -> NodeDescription:
        return self.node.model_copy(deep=True)

    def _gpu(self, index: int) -> GpuDescription:
        if not 0 <= index < len(self.node.gpus):
            raise MigError(f"GPU {index} does not exist on {self.node.node_id}")
        return self.node.gpus[index]

    def _mig_uuid(self, g: GpuDescription, profile: str, start: int, generation: int) -> str:
        return f"MIG-{uuidlib.uuid5(_NS, f'{g.uuid}/{profile}/{start}/{generation}')}"

    # ------------------------------------------------------------ MIG
    def mig_mode(self, gpu_index: int) -> bool:
        return self._gpu(gpu_index).mig_enabled

    def mig_instances(self, gpu_index: int) -> list[MigInstanceDescription]:
        return [mi.model_copy() for mi in self._gpu(gpu_index).mig_instances]

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        g = self._gpu(gpu_index)
        if g.mig_enabled == enabled:
            return
        if enabled and not (g.mig_capable and profiles_for(g.model)):
            raise MigError(f"GPU {gpu_index} ({g.model}) is not MIG-capable")
        if not enabled and g.mig_instances:
            raise MigError(f"GPU {gpu_index} still has {len(g.mig_instances)} MIG instances")
        if any(gpu_index in p.gpus for p in self.pods.values()):
            raise MigError(f"GPU {gpu_index} has running processes: changing MIG mode would need a GPU reset")
        if gpu_index in self.reset_required:
            raise MigError(f"GPU {gpu_index}: changing MIG mode needs a GPU reset (pending until reset)")
        g.mig_enabled = enabled
        self.mig_log.append(("mig-mode", gpu_index, "on" if enabled else "off"))

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        g = self._gpu(gpu_index)
        if not g.mig_enabled:
            raise MigError(f"MIG mode is off on GPU {gpu_index}")
        table = profiles_for(g.model)
        if profile not in table:
            raise MigError(f"profile {profile} is not valid on GPU {gpu_index} ({g.model}); valid: {sorted(table)}")
        p = table[profile]
        if start not in p.starts or start + p.size > MIG_MEMORY_SLOTS:
            raise MigError(f"{profile} cannot start at memory slot {start} (allowed: {list(p.starts)})")
        used_mask = compute = 0
        for mi in g.mig_instances:
            q = table[mi.profile]
            used_mask |= ((1 << q.size) - 1) << mi.start
            compute += q.compute
        if used_mask & (((1 << p.size) - 1) << start):
            raise MigError(f"GPU {gpu_index}: {profile}@{start} overlaps an existing instance")
        if compute + p.compute > MIG_COMPUTE_SLICES:
            raise MigError(f"GPU {gpu_index}: not enough compute slices left for {profile}")
        self._generation += 1
        uuid = self._mig_uuid(g, profile, start, self._generation)
        g.mig_instances.append(MigInstanceDescription(profile=profile, start=start, uuid=uuid))
        g.mig_instances.sort(key=lambda m: m.start)
        self.mig_log.append(("create", gpu_index, f"{profile}@{start}"))
        return uuid

    def destroy_mig(self, gpu_index: int, uuid: str) -> None:
        g = self._gpu(gpu_index)
        found = [mi for mi in g.mig_instances if mi.uuid == uuid]
        if not found:
            raise MigError(f"GPU {gpu_index} has no MIG instance {uuid}")
        if any(p.mig_uuid == uuid for p in self.pods.values()):
            raise MigError(f"MIG instance {uuid} is in use")
        g.mig_instances.remove(found[0])
        self.mig_log.append(("destroy", gpu_index, f"{found[0].profile}@{found[0].start}"))

    # ------------------------------------------------------------ pods and telemetry
    def pod_started(self, pod: PodGpus) -> None:
        self.pods[pod.key] = pod

    def pod_exited(self, key: str) -> None:
        self.pods.pop(key, None)

    def inject_xid(self, gpu_index: int, xid: int) -> None:
        """Simulate an XID error on a GPU (reported with the next sample)."""
        self._xids.setdefault(gpu_index, []).append(xid)

    def _pod_memory_per_gpu(self, pod: PodGpus) -> int:
        limit = pod.memory_limit_bytes // max(1, len(pod.gpus))
        if pod.memory_file and Path(pod.memory_file).exists():
            try:
                wanted = int(Path(pod.memory_file).read_text().strip() or 0)
            except (OSError, ValueError):
                wanted = 0
            return max(0, min(wanted, limit))
        return limit // 4  # a pod that says nothing uses a quarter of what it was given

    def process_memory(self) -> dict[int, int]:
        return {p.pid: self._pod_memory_per_gpu(p) * len(p.gpus) for p in self.pods.values()}

    def sample(self, busy: dict[int, float]) -> list[GpuSample]:
        out = []
        for gpu in self.node.gpus:
            load = min(1.0, busy.get(gpu.index, 0.0))
            jitter = self._rng.uniform(0.9, 1.0) if load else 0.0
            total = gpu.memory_mib * MIB
            on_gpu = [p for p in self.pods.values() if gpu.index in p.gpus]
            procs = [ProcessSample(pid=p.pid, memory_bytes=self._pod_memory_per_gpu(p), mig_uuid=p.mig_uuid)
                     for p in on_gpu]
            spanning = sum(p.share for p in on_gpu if len(p.gpus) > 1)
            nvlink = min(1.0, spanning) * jitter * 150e9 if gpu.nvlink_peers or gpu.nvlink_domain is not None else 0
            out.append(
                GpuSample(
                    index=gpu.index,
                    uuid=gpu.uuid or f"GPU-{self.node.node_id}-{gpu.index}",
                    utilization_ratio=round(load * jitter, 3),
                    memory_used_bytes=min(total, sum(p.memory_bytes for p in procs)),
                    memory_total_bytes=total,
                    memory_bandwidth_ratio=round(load * jitter * 0.6, 3),
                    pcie_tx_bytes_per_s=load * jitter * 2e9,
                    pcie_rx_bytes_per_s=load * jitter * 3e9,
                    sm_clock_hz=1.98e9 if load else 3.45e8,
                    power_watts=70 + 630 * load * (jitter or 1),
                    temperature_c=30 + 45 * load,
                    nvlink_tx_bytes_per_s=nvlink,
                    nvlink_rx_bytes_per_s=nvlink,
                    ecc_uncorrected_errors=self.ecc_uncorrected.get(gpu.index, 0),
                    xid_errors=self._xids.pop(gpu.index, []),
                    processes=procs,
                )
            )
        return out

    def close(self) -> None:
        pass
