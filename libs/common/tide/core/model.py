"""Requests, allocations and placement outcomes (pure data, JSON-friendly)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tide.schemas.job import Resources

MILLI = 1000


class OversubscriptionError(ValueError):
    """Raised by ``Cluster.allocate`` when an allocation does not fit the node's free resources."""


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for. Exactly one GPU kind: whole (gpu_count), share (gpu_milli) or MIG."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_mem_mib: int = 0
    mig_profile: str | None = None
    gpu_models: tuple[str, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.node_selector, dict):
            object.__setattr__(self, "node_selector", tuple(sorted(self.node_selector.items())))
        if not isinstance(self.gpu_models, tuple):
            object.__setattr__(self, "gpu_models", tuple(self.gpu_models))
        kinds = (self.gpu_count > 0) + (self.gpu_milli > 0) + (self.mig_profile is not None)
        if kinds > 1:
            raise ValueError("a PodRequest asks for only one of gpu_count, gpu_milli and mig_profile")
        if not 0 <= self.gpu_milli < MILLI:
            raise ValueError(f"gpu_milli must be 0..999 (a share of one GPU), got {self.gpu_milli}")
        if self.gpu_mem_mib and not self.gpu_milli:
            raise ValueError("gpu_mem_mib is only meaningful with a share (gpu_milli > 0)")
        if min(self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_mem_mib) < 0:
            raise ValueError("negative resource request")

    @property
    def kind(self) -> str:
        if self.gpu_count:
            return "whole"
        if self.gpu_milli:
            return "share"
        if self.mig_profile is not None:
            return "mig"
        return "none"

    @property
    def total_gpu_milli(self) -> int:
        """GPU demand in milli-GPU (MIG counts as compute slices / 7)."""
        if self.gpu_count:
            return self.gpu_count * MILLI
        return self.gpu_milli

    @property
    def selector(self) -> dict[str, str]:
        return dict(self.node_selector)

    @classmethod
    def from_resources(cls, resources: Resources, node_selector: dict[str, str] | None = None) -> PodRequest:
        share = resources.gpu_share
        return cls(
            cpu_milli=resources.cpu_milli,
            memory_mib=resources.memory_mib,
            gpu_count=resources.gpu,
            gpu_milli=min(share.sm_percent * 10, MILLI - 1) if share else 0,
            gpu_mem_mib=share.memory_mib if share else 0,
            mig_profile=resources.mig,
            gpu_models=tuple(resources.gpu_model),
            node_selector=tuple(sorted((node_selector or {}).items())),
        )


@dataclass(frozen=True, slots=True)
class MigAssignment:
    gpu_index: int
    profile: str
    start: int
    repartition: bool = False
    """True when the instance does not exist yet: the node must create it (and maybe enable MIG)."""
    destroyed: tuple[tuple[str, int], ...] = ()
    """Idle instances (profile, start) that the re-partitioning removes; release re-creates them."""
    enables_mig: bool = False


@dataclass(frozen=True, slots=True)
class Allocation:
    node_id: str
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: tuple[int, ...] = ()
    """milli-GPU taken on each of gpu_indices (1000 for whole GPUs)."""
    gpu_mem_mib: tuple[int, ...] = ()
    """GPU memory taken on each of gpu_indices (the whole memory for whole GPUs)."""
    mig: MigAssignment | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    score: float = field(default=0.0, compare=False)

    @property
    def requires_repartition(self) -> bool:
        return self.mig is not None and self.mig.repartition

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node_id": self.node_id,
            "gpu_indices": list(self.gpu_indices),
            "gpu_milli": list(self.gpu_milli),
            "gpu_mem_mib": list(self.gpu_mem_mib),
            "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib,
            "mig": None,
        }
        if self.mig is not None:
            out["mig"] = {
                "gpu_index": self.mig.gpu_index,
                "profile": self.mig.profile,
                "start": self.mig.start,
                "repartition": self.mig.repartition,
                "destroyed": [list(d) for d in self.mig.destroyed],
                "enables_mig": self.mig.enables_mig,
            }
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Allocation:
        mig = data.get("mig")
        return cls(
            node_id=data["node_id"],
            gpu_indices=tuple(data.get("gpu_indices", ())),
            gpu_milli=tuple(data.get("gpu_milli", ())),
            gpu_mem_mib=tuple(data.get("gpu_mem_mib", ())),
            cpu_milli=int(data.get("cpu_milli", 0)),
            memory_mib=int(data.get("memory_mib", 0)),
            mig=None
            if mig is None
            else MigAssignment(
                gpu_index=int(mig["gpu_index"]),
                profile=mig["profile"],
                start=int(mig["start"]),
                repartition=bool(mig.get("repartition", False)),
                destroyed=tuple((str(p), int(s)) for p, s in mig.get("destroyed", ())),
                enables_mig=bool(mig.get("enables_mig", False)),
            ),
        )


@dataclass(frozen=True, slots=True)
class Unfit:
    reason: str
    resolvable: bool = True
    """False when the request can never fit, even on an empty cluster."""
