"""A pynvml-shaped stand-in that models one 8 x H100-80GB SXM node (NVSwitch, 2 sockets, 4 PCIe switches).

It answers the way NVML does (same function names, same constants and error classes from the real
``pynvml``, raising ``NVMLError`` for unsupported queries) so the NVML backend's mapping code runs for
real without a GPU. MIG follows the H100 profile ids, memory sizes and placement rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

NAME = "NVIDIA H100 80GB HBM3"
TOTAL = 85520809984  # 81559 MiB
BUS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
# H100 GPU-instance profiles: enum -> (profile id, slices, memory MB, memory slots)
GI_PROFILES = {0: (19, 1, 9856, 1), 7: (20, 1, 9856, 1), 9: (15, 1, 19968, 2), 1: (14, 2, 19968, 2),
               2: (9, 3, 40192, 4), 3: (5, 4, 40192, 4), 4: (0, 7, 80384, 8)}
# allowed starts by (slices, memory slots)
STARTS = {(1, 1): (0, 1, 2, 3, 4, 5, 6), (1, 2): (0, 2, 4, 6), (2, 2): (0, 2, 4), (3, 4): (0, 4), (4, 4): (0,),
          (7, 8): (0,)}


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass(eq=False)
class Gpu:
    index: int
    mig_current: int = 0
    mig_pending: int = 0
    gis: list[GI] = field(default_factory=list)
    processes: list[tuple[int, int]] = field(default_factory=list)
    used: int = 0
    util: tuple[int, int] = (0, 0)
    nvlink_kib: int = 0


@dataclass(eq=False)
class GI:
    gpu: Gpu
    id: int
    profile_id: int
    start: int
    size: int
    slices: int
    cis: list[CI] = field(default_factory=list)
    processes: list[tuple[int, int]] = field(default_factory=list)


@dataclass(eq=False)
class CI:
    gi: GI
    id: int


@dataclass(eq=False)
class MigDev:
    gi: GI


class FakeNvml:
    NVMLError = pynvml.NVMLError
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t

    def __init__(self, gpus: int = 8, needs_reset: set[int] | None = None, cpus: int | None = None) -> None:
        for k in dir(pynvml):
            if k.startswith(("NVML_", "nvmlEventType")):
                setattr(self, k, getattr(pynvml, k))
        self.gpus = [Gpu(i) for i in range(gpus)]
        self.needs_reset = set(needs_reset or ())
        self.cpus = cpus or os.cpu_count() or 1
        self.events: list[tuple[Gpu, int]] = []
        self.ecc = {i: 0 for i in range(gpus)}
        self.initialized = False
        self.calls: list[str] = []
        self._next_gi = 1

    # ------------------------------------------------------------ init and identity
    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Gpu:
        return self.gpus[i]

    def nvmlDeviceGetName(self, h: Gpu) -> str:
        return NAME

    def nvmlDeviceGetUUID(self, h) -> str:
        if isinstance(h, MigDev):
            return f"MIG-{h.gi.gpu.index:02d}{h.gi.id:02d}aaaa-0000-4000-8000-{h.gi.start:012d}"
        return f"GPU-{h.index:08d}-1111-2222-3333-444444444444"

    def nvmlDeviceGetMemoryInfo(self, h: Gpu):
        return SimpleNamespace(total=TOTAL, used=h.used, free=TOTAL - h.used)

    def nvmlDeviceGetCudaComputeCapability(self, h: Gpu) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetPciInfo(self, h: Gpu):
        return SimpleNamespace(busId=f"00000000:{BUS[h.index]}:00.0".encode())

    def numa(self, h: Gpu) -> int:
        return 0 if h.index < len(self.gpus) // 2 else 1

    def nvmlDeviceGetNumaNodeId(self, h: Gpu) -> int:
        return self.numa(h)

    def nvmlDeviceGetCpuAffinity(self, h: Gpu, words: int) -> list[int]:
        half = max(1, self.cpus // 2)
        cpus = range(0, half) if self.numa(h) == 0 else range(half if self.cpus > 1 else 0, max(self.cpus, 1))
        mask = [0] * words
        for c in cpus:
            if c // 64 < words:
                mask[c // 64] |= 1 << (c % 64)
        return mask

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Gpu, b: Gpu) -> int:
        if a.index // 2 == b.index // 2:
            return pynvml.NVML_TOPOLOGY_SINGLE
        if self.numa(a) == self.numa(b):
            return pynvml.NVML_TOPOLOGY_NODE
        return pynvml.NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetNvLinkState(self, h: Gpu, link: int) -> int:
        if link >= 18:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Gpu, link: int) -> int:
        return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Gpu, link: int):
        return SimpleNamespace(busId=b"00000000:00:00.0")  # an NVSwitch, not a GPU

    # ------------------------------------------------------------ telemetry
    def nvmlDeviceGetUtilizationRates(self, h: Gpu):
        if h.mig_current:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=h.util[0], memory=h.util[1])

    def nvmlDeviceGetPcieThroughput(self, h: Gpu, counter: int) -> int:
        return 1000 * (h.index + 1) if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 2000 * (h.index + 1)

    def nvmlDeviceGetClockInfo(self, h: Gpu, kind: int) -> int:
        return 1980

    def nvmlDeviceGetPowerUsage(self, h: Gpu) -> int:
        return 350_500

    def nvmlDeviceGetTemperature(self, h: Gpu, sensor: int) -> int:
        return 41

    def nvmlDeviceGetTotalEccErrors(self, h: Gpu, kind: int, counter: int) -> int:
        return self.ecc[h.index]

    def nvmlDeviceGetFieldValues(self, h: Gpu, fields: list[int]):
        h.nvlink_kib += 1024 * 1024  # 1 GiB more each time it is read
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=h.nvlink_kib)) for _ in fields]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        procs = h.gi.processes if isinstance(h, MigDev) else h.processes
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs]

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, h: Gpu, types: int, es: str) -> None:
        assert types & pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int):
        if not self.events:
            raise err(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self.events.pop(0)
        return SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)

    # ------------------------------------------------------------ MIG
    def nvmlDeviceGetMigMode(self, h: Gpu) -> list[int]:
        return [h.mig_current, h.mig_pending]

    def nvmlDeviceSetMigMode(self, h: Gpu, mode: int) -> int:
        self.calls.append(f"set-mig-mode {h.index} {mode}")
        h.mig_pending = mode
        if h.index not in self.needs_reset:
            h.mig_current = mode
        return 0

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Gpu, profile: int, version: int = 2):
        if profile not in GI_PROFILES:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pid, slices, mem, _ = GI_PROFILES[profile]
        return SimpleNamespace(id=pid, sliceCount=slices, memorySizeMB=mem, instanceCount=7 // slices)

    def _size(self, profile_id: int) -> tuple[int, int]:
        for pid, slices, _mem, size in GI_PROFILES.values():
            if pid == profile_id:
                return slices, size
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: Gpu, profile_id: int, placement) -> GI:
        if not h.mig_current:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slices, size = self._size(profile_id)
        if placement.size != size or placement.start not in STARTS[(slices, size)]:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for gi in h.gis:
            if gi.start < placement.start + size and placement.start < gi.start + gi.size:
                raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        if sum(gi.slices for gi in h.gis) + slices > 7:
            raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = GI(h, self._next_gi, profile_id, placement.start, size, slices)
        self._next_gi += 1
        h.gis.append(gi)
        self.calls.append(f"create-gi {h.index} {profile_id}@{placement.start}")
        return gi

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: GI, profile: int, eng: int, version: int = 2):
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}.get(profile)
        if slices is None or slices > gi.slices:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=profile, sliceCount=slices)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: GI, profile_id: int) -> CI:
        ci = CI(gi, len(gi.cis))
        gi.cis.append(ci)
        return ci

    def nvmlGpuInstanceGetInfo(self, gi: GI):
        return SimpleNamespace(id=gi.id, profileId=gi.profile_id,
                               placement=SimpleNamespace(start=gi.start, size=gi.size))

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Gpu) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Gpu, k: int) -> MigDev:
        devs = [gi for gi in h.gis if gi.cis]
        if k >= len(devs):
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        return MigDev(devs[k])

    def nvmlDeviceGetGpuInstanceId(self, mh: MigDev) -> int:
        return mh.gi.id

    def nvmlDeviceGetComputeInstanceId(self, mh: MigDev) -> int:
        return mh.gi.cis[0].id

    def nvmlDeviceGetGpuInstanceById(self, h: Gpu, gi_id: int) -> GI:
        for gi in h.gis:
            if gi.id == gi_id:
                return gi
        raise err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: GI, ci_id: int) -> CI:
        for ci in gi.cis:
            if ci.id == ci_id:
                return ci
        raise err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlComputeInstanceDestroy(self, ci: CI) -> None:
        if ci.gi.processes:
            raise err(pynvml.NVML_ERROR_IN_USE)
        ci.gi.cis.remove(ci)

    def nvmlGpuInstanceDestroy(self, gi: GI) -> None:
        if gi.cis or gi.processes:
            raise err(pynvml.NVML_ERROR_IN_USE)
        gi.gpu.gis.remove(gi)
        self.calls.append(f"destroy-gi {gi.gpu.index} {gi.profile_id}@{gi.start}")
