"""The real NVML backend through pynvml (nvidia-ml-py). It never falls back to simulation.

The ``nvml`` module is a constructor parameter (default: the real ``pynvml``), so tests can hand in a
pynvml-shaped object that models a node and exercise the code that maps NVML's answers to Tide's
model. Every optional query (NVLink, ECC, PCIe throughput, NUMA id, ...) is allowed to be
unsupported on a given GPU: it then reads as absent/zero, never as an agent failure.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import structlog
from tide.core.mig import profiles_for
from tide.schemas.events import GpuSample, ProcessSample
from tide.schemas.node import GpuDescription, MigInstanceDescription, NodeDescription

from tide_node_agent.gpu import BackendUnavailable, MigError, PodGpus, mig_profile_by_shape

log = structlog.get_logger()

# Marketing memory sizes per family: NVML reports usable memory (e.g. 79.6 GiB for an "80GB" H100).
_SIZES_GB = {
    "H200": (141,), "H100": (80, 94, 96), "H800": (80,), "A100": (40, 80), "A800": (40, 80), "A30": (24,),
    "A40": (48,), "A10": (24,), "L40S": (48,), "L40": (48,), "L4": (24,), "T4": (16,), "V100": (16, 32),
    "GH200": (96, 144), "B200": (180, 192),
}
_FAMILY = re.compile(r"\b(GH200|B200|H200|H100|H800|A100|A800|A30|A40|A10|L40S|L40|L4|T4|V100)\b")

# nvmlDeviceGetTopologyCommonAncestor levels -> Tide link classes
_TOPOLOGY = {0: "pcie_switch", 10: "pcie_switch", 20: "pcie_multi_switch", 30: "root_complex", 40: "same_numa",
             50: "cross_socket"}
# compute-instance profile per compute slice count
_CI_PROFILE_NAMES = {1: "1_SLICE", 2: "2_SLICE", 3: "3_SLICE", 4: "4_SLICE", 6: "6_SLICE", 7: "7_SLICE",
                     8: "8_SLICE"}


def tide_model_name(nvml_name: str, memory_bytes: int) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100-80GB'; the names tide.core.mig and job specs use."""
    gib = memory_bytes / 2**30
    m = _FAMILY.search(nvml_name.replace("-", " "))
    if not m:
        return nvml_name.replace("NVIDIA ", "").replace(" ", "-")
    family = m.group(1)
    sizes = _SIZES_GB.get(family, ())
    named = re.search(r"(\d+)\s*GB", nvml_name)
    if named and int(named.group(1)) in sizes:
        gb = int(named.group(1))
    elif sizes:
        gb = min(sizes, key=lambda s: abs(s * 0.93 - gib))  # usable memory is ~93-99% of the nominal size
    else:
        gb = round(gib)
    return f"{family}-{gb}GB"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(value: Any) -> str:
    return _s(value).upper()


def _nvml():  # imported lazily so the simulated backend never needs the library
    try:
        import pynvml
    except ImportError as exc:  # an install without the agent extra
        raise BackendUnavailable("NVML mode needs nvidia-ml-py: pip install 'tide-scheduler[agent]'") from exc
    return pynvml


class NvmlBackend:
    def __init__(self, node_id: str, labels: dict[str, str] | None = None, nvml: Any = None) -> None:
        self.nvml = nvml if nvml is not None else _nvml()
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise BackendUnavailable(
                f"NVML is not available on this machine ({exc}); install the NVIDIA driver, "
                "or run the agent with TIDE_NVML_BACKEND=simulated and a node file"
            ) from exc
        self.node_id = node_id
        self.labels = labels or {}
        self.count = int(self.nvml.nvmlDeviceGetCount())
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]
        self.models = [self._model(h) for h in self.handles]
        self._nvlink_prev: dict[int, tuple[float, int, int]] = {}
        self._events = self._register_xid_events()

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down
            pass

    # ------------------------------------------------------------ small wrappers
    def _try(self, fn: str, *args: Any, default: Any = None) -> Any:
        """Call an optional NVML query; unsupported (or missing in this pynvml) -> ``default``."""
        f = getattr(self.nvml, fn, None)
        if f is None:
            return default
        try:
            return f(*args)
        except self.nvml.NVMLError:
            return default

    def _model(self, h: Any) -> str:
        return tide_model_name(_s(self.nvml.nvmlDeviceGetName(h)), int(self.nvml.nvmlDeviceGetMemoryInfo(h).total))

    def _handle(self, index: int) -> Any:
        if not 0 <= index < self.count:
            raise MigError(f"GPU {index} does not exist on {self.node_id}")
        return self.handles[index]

    # ------------------------------------------------------------ discovery
    def discover(self) -> NodeDescription:
        n = self.nvml
        cpus = os.cpu_count() or 1
        bus_ids = [_bus(n.nvmlDeviceGetPciInfo(h).busId) for h in self.handles]
        index_of_bus = {b: i for i, b in enumerate(bus_ids)}
        peers, via_switch = self._nvlinks(index_of_bus)
        domains = self._nvlink_domains(peers, via_switch)
        levels = {
            (i, j): self._try("nvmlDeviceGetTopologyCommonAncestor", self.handles[i], self.handles[j])
            for i in range(self.count) for j in range(self.count) if i != j
        }
        switches = self._components(lambda i, j: levels[(i, j)] is not None and levels[(i, j)] <= 20)
        gpus = []
        for i, h in enumerate(self.handles):
            mem = n.nvmlDeviceGetMemoryInfo(h)
            mode = self._try("nvmlDeviceGetMigMode", h)
            mig_capable = mode is not None and bool(profiles_for(self.models[i]))
            mig_enabled = bool(mode and mode[0])
            cc = self._try("nvmlDeviceGetCudaComputeCapability", h)
            affinity = self._cpu_affinity(h, cpus)
            numa = self._try("nvmlDeviceGetNumaNodeId", h)
            if numa is None or numa < 0:
                numa = _sysfs_numa(bus_ids[i])
            topology = {}
            for j in range(self.count):
                if j == i:
                    continue
                topology[j] = "nvlink" if j in peers[i] else _TOPOLOGY.get(levels[(i, j)], "cross_socket")
            gpus.append(GpuDescription(
                index=i,
                model=self.models[i],
                memory_mib=int(mem.total // (1024 * 1024)),
                uuid=_s(n.nvmlDeviceGetUUID(h)),
                mig_capable=mig_capable,
                mig_enabled=mig_enabled,
                mig_instances=self.mig_instances(i) if mig_enabled else [],
                pcie_switch=switches[i],
                numa_node=max(0, numa),
                nvlink_domain=domains[i],
                nvlink_peers=sorted(peers[i]),
                compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                pci_bus_id=bus_ids[i],
                cpu_affinity=affinity,
                topology=topology,
            ))
        return NodeDescription(
            node_id=self.node_id,
            cpu_milli=cpus * 1000,
            memory_mib=int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)),
            numa_nodes=max([g.numa_node for g in gpus] + [0]) + 1,
            labels=dict(self.labels),
            gpus=gpus,
        )

    def _cpu_affinity(self, h: Any, cpus: int) -> list[int]:
        words = (cpus + 63) // 64
        mask = self._try("nvmlDeviceGetCpuAffinity", h, words)
        if mask is None:
            return []
        out = []
        for w, bits in enumerate(mask):
            for b in range(64):
                if int(bits) >> b & 1:
                    out.append(w * 64 + b)
        return out

    def _nvlinks(self, index_of_bus: dict[str, int]) -> tuple[list[set[int]], list[bool]]:
        """Direct NVLink peers per GPU, and whether the GPU reaches an NVSwitch."""
        n = self.nvml
        peers: list[set[int]] = [set() for _ in range(self.count)]
        via_switch = [False] * self.count
        switch_type = getattr(n, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        for i, h in enumerate(self.handles):
            for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
                if self._try("nvmlDeviceGetNvLinkState", h, link) != getattr(n, "NVML_FEATURE_ENABLED", 1):
                    continue
                if self._try("nvmlDeviceGetNvLinkRemoteDeviceType", h, link) == switch_type:
                    via_switch[i] = True
                    continue
                remote = self._try("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
                j = index_of_bus.get(_bus(remote.busId)) if remote is not None else None
                if j is not None and j != i:
                    peers[i].add(j)
        switched = [i for i in range(self.count) if via_switch[i]]
        for i in switched:  # every GPU on the NVSwitch fabric reaches every other at full NVLink bandwidth
            peers[i].update(j for j in switched if j != i)
        return peers, via_switch

    def _nvlink_domains(self, peers: list[set[int]], via_switch: list[bool]) -> list[int | None]:
        comp = self._components(lambda i, j: j in peers[i] or i in peers[j])
        ids: dict[int, int] = {}
        out: list[int | None] = []
        for i in range(self.count):
            if not peers[i] and not via_switch[i]:
                out.append(None)
                continue
            out.append(ids.setdefault(comp[i], len(ids)))
        return out

    def _components(self, linked) -> list[int]:
        comp = list(range(self.count))

        def find(a: int) -> int:
            while comp[a] != a:
                comp[a] = comp[comp[a]]
                a = comp[a]
            return a

        for i in range(self.count):
            for j in range(i + 1, self.count):
                if linked(i, j):
                    comp[find(j)] = find(i)
        roots: dict[int, int] = {}
        return [roots.setdefault(find(i), len(roots)) for i in range(self.count)]

    # ------------------------------------------------------------ MIG
    def _gi_profiles(self, h: Any) -> dict[int, Any]:
        """NVML GPU-instance profile enum -> profile info, for the profiles this GPU supports."""
        out = {}
        for p in range(int(getattr(self.nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 10))):
            info = self._try("nvmlDeviceGetGpuInstanceProfileInfo", h, p)
            if info is not None:
                out[p] = info
        return out

    def _mig_handles(self, h: Any) -> list[Any]:
        out = []
        for k in range(int(self._try("nvmlDeviceGetMaxMigDeviceCount", h, default=0) or 0)):
            mh = self._try("nvmlDeviceGetMigDeviceHandleByIndex", h, k)
            if mh is not None:
                out.append(mh)
        return out

    def mig_mode(self, gpu_index: int) -> bool:
        mode = self._try("nvmlDeviceGetMigMode", self._handle(gpu_index))
        return bool(mode and mode[0])

    def mig_instances(self, gpu_index: int) -> list[MigInstanceDescription]:
        n = self.nvml
        h = self._handle(gpu_index)
        by_id = {info.id: info for info in self._gi_profiles(h).values()}
        out = []
        for mh in self._mig_handles(h):
            gi = n.nvmlDeviceGetGpuInstanceById(h, n.nvmlDeviceGetGpuInstanceId(mh))
            info = n.nvmlGpuInstanceGetInfo(gi)
            prof = by_id.get(info.profileId)
            name = mig_profile_by_shape(self.models[gpu_index], int(prof.sliceCount), int(info.placement.size)) \
                if prof is not None else None
            if name is None:
                log.warning("mig_instance_unknown_profile", gpu=gpu_index, profile_id=info.profileId)
                continue
            out.append(MigInstanceDescription(profile=name, start=int(info.placement.start),
                                              uuid=_s(n.nvmlDeviceGetUUID(mh))))
        return sorted(out, key=lambda m: m.start)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        n = self.nvml
        h = self._handle(gpu_index)
        if not profiles_for(self.models[gpu_index]):
            raise MigError(f"GPU {gpu_index} ({self.models[gpu_index]}) is not MIG-capable")
        mode = self._try("nvmlDeviceGetMigMode", h)
        if mode is None:
            raise MigError(f"GPU {gpu_index}: NVML does not support MIG mode on this GPU/driver")
        want = n.NVML_DEVICE_MIG_ENABLE if enabled else n.NVML_DEVICE_MIG_DISABLE
        if bool(mode[0]) == enabled:
            return
        if self._try("nvmlDeviceGetComputeRunningProcesses", h, default=[]):
            raise MigError(f"GPU {gpu_index} has running processes: changing MIG mode would need a GPU reset")
        try:
            n.nvmlDeviceSetMigMode(h, want)
        except n.NVMLError as exc:
            raise MigError(f"GPU {gpu_index}: cannot change MIG mode ({exc}); it may need root or a GPU reset") \
                from exc
        current, pending = n.nvmlDeviceGetMigMode(h)
        if bool(current) != enabled:
            try:  # do not leave a pending change behind for the next reset
                n.nvmlDeviceSetMigMode(h, current)
            except n.NVMLError:
                pass
            raise MigError(f"GPU {gpu_index}: MIG mode change is pending a GPU reset (current={current}, "
                           f"pending={pending}); reset the GPU (nvidia-smi -r) or enable MIG mode at boot")

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        n = self.nvml
        h = self._handle(gpu_index)
        model = self.models[gpu_index]
        table = profiles_for(model)
        if profile not in table:
            raise MigError(f"profile {profile} is not valid on GPU {gpu_index} ({model}); valid: {sorted(table)}")
        p = table[profile]
        if start not in p.starts:
            raise MigError(f"{profile} cannot start at memory slot {start} (allowed: {list(p.starts)})")
        mode = self._try("nvmlDeviceGetMigMode", h)
        if not mode or not mode[0]:
            raise MigError(f"MIG mode is off on GPU {gpu_index}")
        candidates = [info for info in self._gi_profiles(h).values() if int(info.sliceCount) == p.compute]
        if not candidates:
            raise MigError(f"GPU {gpu_index}: the driver offers no {p.compute}-slice GPU instance profile")
        gi_info = min(candidates, key=lambda info: abs(int(info.memorySizeMB) - p.memory_mib))
        placement = n.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, p.size
        try:
            gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, gi_info.id, placement)
        except n.NVMLError as exc:
            raise MigError(f"GPU {gpu_index}: cannot create {profile}@{start} ({exc})") from exc
        try:
            ci_enum = getattr(n, f"NVML_COMPUTE_INSTANCE_PROFILE_{_CI_PROFILE_NAMES[p.compute]}")
            ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_enum, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            n.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        except n.NVMLError as exc:
            self._try("nvmlGpuInstanceDestroy", gi)
            raise MigError(f"GPU {gpu_index}: cannot create the compute instance of {profile}@{start} ({exc})") \
                from exc
        gi_id = n.nvmlGpuInstanceGetInfo(gi).id
        for mh in self._mig_handles(h):
            if n.nvmlDeviceGetGpuInstanceId(mh) == gi_id:
                return _s(n.nvmlDeviceGetUUID(mh))
        raise MigError(f"GPU {gpu_index}: created {profile}@{start} but NVML shows no MIG device for it")

    def destroy_mig(self, gpu_index: int, uuid: str) -> None:
        n = self.nvml
        h = self._handle(gpu_index)
        for mh in self._mig_handles(h):
            if _s(n.nvmlDeviceGetUUID(mh)) != uuid:
                continue
            gi = n.nvmlDeviceGetGpuInstanceById(h, n.nvmlDeviceGetGpuInstanceId(mh))
            try:
                ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, n.nvmlDeviceGetComputeInstanceId(mh))
                n.nvmlComputeInstanceDestroy(ci)
                n.nvmlGpuInstanceDestroy(gi)
            except n.NVMLError as exc:
                raise MigError(f"GPU {gpu_index}: cannot destroy MIG instance {uuid} ({exc})") from exc
            return
        raise MigError(f"GPU {gpu_index} has no MIG instance {uuid}")

    # ------------------------------------------------------------ pods and telemetry
    def pod_started(self, pod: PodGpus) -> None:
        pass  # NVML sees the processes itself

    def pod_exited(self, key: str) -> None:
        pass

    def _processes(self, index: int) -> list[ProcessSample]:
        h = self.handles[index]
        mode = self._try("nvmlDeviceGetMigMode", h)
        devices = [(mh, _s(self.nvml.nvmlDeviceGetUUID(mh))) for mh in self._mig_handles(h)] \
            if mode and mode[0] else [(h, None)]
        out = []
        for dh, mig_uuid in devices:
            for p in self._try("nvmlDeviceGetComputeRunningProcesses", dh, default=[]) or []:
                used = getattr(p, "usedGpuMemory", None)
                out.append(ProcessSample(pid=int(p.pid), memory_bytes=int(used or 0), mig_uuid=mig_uuid))
        return out

    def process_memory(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for i in range(self.count):
            for p in self._processes(i):
                out[p.pid] = out.get(p.pid, 0) + p.memory_bytes
        return out

    def _register_xid_events(self) -> Any:
        n = self.nvml
        es = self._try("nvmlEventSetCreate")
        if es is None:
            return None
        for h in self.handles:
            self._try("nvmlDeviceRegisterEvents", h, getattr(n, "nvmlEventTypeXidCriticalError", 8), es)
        return es

    def _drain_xids(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        n = self.nvml
        uuids = {_s(n.nvmlDeviceGetUUID(h)): i for i, h in enumerate(self.handles)}
        for _ in range(64):
            data = self._try("nvmlEventSetWait_v2", self._events, 0)
            if data is None:  # NVMLError_Timeout: nothing pending
                break
            i = uuids.get(_s(self._try("nvmlDeviceGetUUID", data.device, default="")))
            if i is not None:
                out.setdefault(i, []).append(int(data.eventData))
        return out

    def _nvlink_rates(self, index: int) -> tuple[float, float]:
        n = self.nvml
        fields = [getattr(n, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138),
                  getattr(n, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139)]
        values = self._try("nvmlDeviceGetFieldValues", self.handles[index], fields)
        if not values or any(int(getattr(v, "nvmlReturn", 0)) != 0 for v in values):
            return 0.0, 0.0
        now, tx, rx = time.monotonic(), int(values[0].value.ullVal) * 1024, int(values[1].value.ullVal) * 1024
        prev = self._nvlink_prev.get(index)
        self._nvlink_prev[index] = (now, tx, rx)
        if prev is None or now <= prev[0]:
            return 0.0, 0.0
        dt = now - prev[0]
        return max(0.0, (tx - prev[1]) / dt), max(0.0, (rx - prev[2]) / dt)

    def sample(self, busy: dict[int, float]) -> list[GpuSample]:
        n = self.nvml
        xids = self._drain_xids()
        out = []
        for i, h in enumerate(self.handles):
            util = self._try("nvmlDeviceGetUtilizationRates", h)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            nv_tx, nv_rx = self._nvlink_rates(i)
            out.append(
                GpuSample(
                    index=i,
                    uuid=_s(n.nvmlDeviceGetUUID(h)),
                    utilization_ratio=util.gpu / 100.0 if util is not None else 0.0,
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                    memory_bandwidth_ratio=util.memory / 100.0 if util is not None else 0.0,
                    pcie_tx_bytes_per_s=float(self._try("nvmlDeviceGetPcieThroughput", h,
                                                        n.NVML_PCIE_UTIL_TX_BYTES, default=0)) * 1024,
                    pcie_rx_bytes_per_s=float(self._try("nvmlDeviceGetPcieThroughput", h,
                                                        n.NVML_PCIE_UTIL_RX_BYTES, default=0)) * 1024,
                    sm_clock_hz=float(self._try("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM, default=0)) * 1e6,
                    power_watts=float(self._try("nvmlDeviceGetPowerUsage", h, default=0)) / 1000.0,
                    temperature_c=float(self._try("nvmlDeviceGetTemperature", h, n.NVML_TEMPERATURE_GPU,
                                                  default=0)),
                    nvlink_tx_bytes_per_s=nv_tx,
                    nvlink_rx_bytes_per_s=nv_rx,
                    ecc_uncorrected_errors=int(self._try("nvmlDeviceGetTotalEccErrors", h,
                                                         n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                         n.NVML_VOLATILE_ECC, default=0)),
                    xid_errors=xids.get(i, []),
                    processes=self._processes(i),
                )
            )
        return out


def _sysfs_numa(bus_id: str) -> int:
    """NUMA node of a PCI device from sysfs (NVML bus ids have an 8-digit domain; sysfs uses 4)."""
    short = bus_id.lower()[4:] if len(bus_id) == 16 else bus_id.lower()
    try:
        return int(Path(f"/sys/bus/pci/devices/{short}/numa_node").read_text().strip())
    except (OSError, ValueError):
        return 0
