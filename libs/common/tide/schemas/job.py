"""The job spec users submit (Kubernetes-flavoured, see docs/architecture.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tide.core.mig import ALL_PROFILE_NAMES

JOB_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$"
QUEUE_PATTERN = r"^[a-z0-9][a-z0-9-]*(/[a-z0-9][a-z0-9-]*)*$"
MAX_GPUS_PER_POD = 16
MAX_REPLICAS = 4096


class PriorityClass(StrEnum):
    ONLINE_SERVING = "online-serving"
    OFFLINE_TRAINING = "offline-training"
    BEST_EFFORT = "best-effort"


PRIORITY_VALUES: dict[PriorityClass, int] = {
    PriorityClass.ONLINE_SERVING: 1000,
    PriorityClass.OFFLINE_TRAINING: 500,
    PriorityClass.BEST_EFFORT: 0,
}

TopologyLevel = Literal["nvlink", "pcie-switch", "numa", "node", "rack", "spine"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class GpuShare(_Strict):
    memory_mib: int = Field(alias="memoryMiB", gt=0, le=1024 * 1024, description="GPU memory limit")
    sm_percent: int = Field(alias="smPercent", gt=0, le=100, description="share of the GPU's SMs")


class Resources(_Strict):
    gpu: int = Field(default=0, ge=0, le=MAX_GPUS_PER_POD, description="whole GPUs per pod")
    gpu_model: list[str] = Field(default_factory=list, alias="gpuModel", description="allowed GPU models")
    gpu_share: GpuShare | None = Field(default=None, alias="gpuShare")
    mig: str | None = Field(default=None, description="MIG profile, e.g. 1g.10gb")
    cpu_milli: int = Field(default=1000, alias="cpuMilli", ge=0, le=10_000_000)
    memory_mib: int = Field(default=1024, alias="memoryMiB", ge=0, le=64 * 1024 * 1024)

    @field_validator("gpu_share")
    @classmethod
    def _share_alone(cls, value: GpuShare | None, info: ValidationInfo) -> GpuShare | None:
        if value is not None and info.data.get("gpu", 0) > 0:
            raise ValueError("gpuShare cannot be combined with gpu: set only one of gpu, gpuShare and mig")
        return value

    @field_validator("mig")
    @classmethod
    def _mig_alone(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if info.data.get("gpu", 0) > 0 or info.data.get("gpu_share") is not None:
            raise ValueError("mig cannot be combined with gpu or gpuShare: set only one of gpu, gpuShare and mig")
        if value not in ALL_PROFILE_NAMES:
            raise ValueError(f"unknown MIG profile {value!r}; known: {', '.join(sorted(ALL_PROFILE_NAMES))}")
        return value

    @property
    def gpu_kind(self) -> Literal["whole", "share", "mig", "none"]:
        if self.gpu > 0:
            return "whole"
        if self.gpu_share is not None:
            return "share"
        if self.mig is not None:
            return "mig"
        return "none"


class PodTemplate(_Strict):
    command: list[str] = Field(min_length=1, max_length=256)
    image: str | None = Field(default=None, max_length=512,
                              description="container image, for agents that run pods in containers")
    env: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")


class Topology(_Strict):
    require: TopologyLevel | None = None
    prefer: TopologyLevel | None = None


class JobMetadata(_Strict):
    name: str = Field(pattern=JOB_NAME_PATTERN)
    queue: str = Field(default="default", pattern=QUEUE_PATTERN, max_length=128)
    priority_class: PriorityClass = Field(default=PriorityClass.OFFLINE_TRAINING, alias="priorityClass")
    labels: dict[str, str] = Field(default_factory=dict)


class JobBody(_Strict):
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    min_member: int | None = Field(default=None, alias="minMember", ge=1, le=MAX_REPLICAS)
    topology: Topology = Field(default_factory=Topology)
    grace_period_s: float = Field(default=30.0, alias="gracePeriodSeconds", ge=0, le=3600)
    runtime_estimate_s: float | None = Field(
        default=None, alias="runtimeSeconds", gt=0, le=90 * 24 * 3600,
        description="expected runtime; lets the job backfill in front of a waiting gang")
    preemptible: bool | None = Field(
        default=None, description="false: never a preemption victim (it may then not borrow beyond its queue's "
                                  "guarantee); default: as its priority class says")
    gang_timeout_s: int | None = Field(
        default=None, alias="gangTimeoutSeconds", gt=0, le=90 * 24 * 3600,
        description="a pending gang that waited longer than this since it was queued times out (see onTimeout)")
    on_timeout: Literal["fail", "shrink"] = Field(
        default="fail", alias="onTimeout",
        description="fail: the job fails; shrink: minMember becomes 1 and the other pods are elastic extras")
    template: PodTemplate

    @field_validator("min_member")
    @classmethod
    def _gang(cls, value: int | None, info: ValidationInfo) -> int | None:
        replicas = info.data.get("replicas")
        if value is not None and replicas is not None and value > replicas:
            raise ValueError(f"minMember ({value}) must be <= replicas ({replicas})")
        return value

    @property
    def gang_size(self) -> int:
        return self.min_member if self.min_member is not None else self.replicas

    @property
    def elastic(self) -> bool:
        """Pods beyond ``minMember`` are elastic extras: placed when room exists, the first victims."""
        return self.replicas > self.gang_size


class JobSpec(_Strict):
    api_version: Literal["tide/v1"] = Field(default="tide/v1", alias="apiVersion")
    kind: Literal["Job"] = "Job"
    metadata: JobMetadata
    spec: JobBody
