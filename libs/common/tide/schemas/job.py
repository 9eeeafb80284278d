"""The job spec users submit (Kubernetes-flavoured, see docs/jobspec.md and docs/architecture.md).

Besides Tide's own resource fields, ``resources`` accepts the names users of Kubernetes, the NVIDIA
device plugin and HAMi already write (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``,
``nvidia.com/gpumem``, ``nvidia.com/gpucores``, ``cpu: 500m``, ``memory: 64Gi``) and GPU Feature
Discovery's model names (``NVIDIA-H100-80GB-HBM3``). They are translated, before validation, by the
pure functions below into Tide's fields: a stored spec always has the canonical form.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

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


# ---------------------------------------------------------------- aliases (pure)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
MIB_BYTES = 2**20


def parse_quantity(value: object) -> float:
    """A Kubernetes quantity (``64Gi``, ``500m``, ``1.5``, ``2e3``, or a number) as a plain number."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{value!r} is not a non-negative quantity")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise ValueError(f"{value!r} is not a quantity (e.g. 64Gi, 512Mi, 16, 500m)")
    number = float(m[1]) * (10 ** int(m[2]) if m[2] else 1)
    suffix = m[3] or ""
    return number * (_BINARY.get(suffix) or _DECIMAL.get(suffix) or 1)


def cpu_milli(value: object) -> int:
    """Kubernetes CPU (``16``, ``500m``, ``1.5``) in millicores, rounded up."""
    return math.ceil(round(parse_quantity(value) * 1000, 6))


def memory_mib(value: object) -> int:
    """Kubernetes memory (bytes: ``64Gi``, ``1G``, ``1073741824``) in MiB, rounded up."""
    return math.ceil(round(parse_quantity(value) / MIB_BYTES, 6))


_GFD_VENDOR = re.compile(r"^(NVIDIA|Tesla)[- ]")
KNOWN_MEMORY = {"H100": "80GB", "H200": "141GB", "H800": "80GB", "A800": "80GB"}
"""Models GFD may name without their memory; Tide's short names carry it."""


def gpu_model_name(name: str) -> str:
    """A GPU Feature Discovery product name (``nvidia.com/gpu.product``) as Tide's short model name:
    ``NVIDIA-H100-80GB-HBM3`` -> ``H100-80GB``, ``NVIDIA-A100-SXM4-80GB`` -> ``A100-80GB``,
    ``Tesla-V100-SXM2-16GB`` -> ``V100M16`` (the openb traces' name), ``Tesla-T4`` -> ``T4``. Form factors
    (SXM4, PCIE, HBM3) are dropped. Names without the vendor prefix (Tide's own) pass unchanged."""
    if not _GFD_VENDOR.match(name):
        return name
    parts = [p for p in re.split(r"[- ]", _GFD_VENDOR.sub("", name)) if p]
    if not parts:
        return name
    family = parts[0].upper()
    memory = next((p.upper() for p in parts[1:] if re.fullmatch(r"\d+GB", p, re.IGNORECASE)), None)
    if family == "V100":
        return f"V100M{memory.removesuffix('GB')}" if memory else "V100M16"
    memory = memory or KNOWN_MEMORY.get(family)
    return f"{family}-{memory}" if memory else family


GPU_ALIAS = "nvidia.com/gpu"
GPUMEM_ALIAS = "nvidia.com/gpumem"  # HAMi: MiB of GPU memory
GPUCORES_ALIAS = "nvidia.com/gpucores"  # HAMi: percent of the GPU's SMs
MIG_ALIAS_PREFIX = "nvidia.com/mig-"


def normalize_resources(raw: dict[str, Any]) -> dict[str, Any]:
    """Translate the alias keys of a ``resources`` mapping into Tide's own fields.

    Raises ValueError naming the alias when one is malformed or conflicts with another key. Keys that
    are neither Tide's fields nor aliases are left for the model to reject (``extra="forbid"``)."""
    out = dict(raw)

    def take(key: str, canonical: str) -> Any:
        value = out.pop(key)
        if canonical in out:
            raise ValueError(f"{key} and {canonical} are the same resource: set only one")
        return value

    if "cpu" in out:
        value = take("cpu", "cpuMilli")
        try:
            out["cpuMilli"] = cpu_milli(value)
        except ValueError as exc:
            raise ValueError(f"cpu: {exc}") from None
    if "memory" in out:
        value = take("memory", "memoryMiB")
        try:
            out["memoryMiB"] = memory_mib(value)
        except ValueError as exc:
            raise ValueError(f"memory: {exc}") from None
    migs = [k for k in out if isinstance(k, str) and k.startswith(MIG_ALIAS_PREFIX)]
    if len(migs) > 1:
        raise ValueError(f"{', '.join(sorted(migs))}: a pod gets one MIG instance; set one profile")
    for key in migs:
        count = take(key, "mig")
        if count != 1:
            raise ValueError(f"{key}: must be 1 (a pod gets one MIG instance), not {count!r}")
        out["mig"] = key.removeprefix(MIG_ALIAS_PREFIX)
    hami = GPUMEM_ALIAS in out or GPUCORES_ALIAS in out
    if hami:
        if "gpuShare" in out or "gpu_share" in out:
            raise ValueError(f"{GPUMEM_ALIAS}/{GPUCORES_ALIAS} and gpuShare are the same resource: set only one")
        if GPUMEM_ALIAS not in out:
            raise ValueError(f"{GPUCORES_ALIAS} needs {GPUMEM_ALIAS} (MiB of GPU memory) beside it")
        count = out.pop(GPU_ALIAS, 1)
        if count != 1:
            raise ValueError(f"{GPU_ALIAS}: a GPU share is one GPU, so with {GPUMEM_ALIAS} it must be 1, "
                             f"not {count!r}")
        out["gpuShare"] = {"memoryMiB": out.pop(GPUMEM_ALIAS), "smPercent": out.pop(GPUCORES_ALIAS, 100)}
    if GPU_ALIAS in out:
        out["gpu"] = take(GPU_ALIAS, "gpu")
    return out


def _resources_schema(schema: dict[str, Any]) -> None:
    """The aliases in the published JSON Schema, so editors accept what the validators accept."""
    quantity = {"anyOf": [{"type": "string", "pattern": _QUANTITY.pattern}, {"type": "number", "minimum": 0}]}
    props = schema.setdefault("properties", {})
    props[GPU_ALIAS] = {"type": "integer", "minimum": 0, "maximum": MAX_GPUS_PER_POD,
                        "description": "alias of gpu (NVIDIA device plugin); 1 beside nvidia.com/gpumem"}
    props[GPUMEM_ALIAS] = {"type": "integer", "exclusiveMinimum": 0,
                           "description": "HAMi: GPU memory of a share in MiB (gpuShare.memoryMiB)"}
    props[GPUCORES_ALIAS] = {"type": "integer", "exclusiveMinimum": 0, "maximum": 100,
                             "description": "HAMi: percent of the GPU's SMs (gpuShare.smPercent; default 100)"}
    props["cpu"] = {**quantity, "description": "Kubernetes CPU quantity (16, 500m), alias of cpuMilli"}
    props["memory"] = {**quantity, "description": "Kubernetes memory quantity (64Gi), alias of memoryMiB"}
    schema["patternProperties"] = {
        r"^nvidia\.com/mig-[0-9]+g\.[0-9]+gb$": {"const": 1, "description": "a MIG profile (alias of mig)"}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class GpuShare(_Strict):
    memory_mib: int = Field(alias="memoryMiB", gt=0, le=1024 * 1024, description="GPU memory limit")
    sm_percent: int = Field(alias="smPercent", gt=0, le=100, description="share of the GPU's SMs")


class Resources(_Strict):
    model_config = ConfigDict(json_schema_extra=_resources_schema)

    gpu: int = Field(default=0, ge=0, le=MAX_GPUS_PER_POD, description="whole GPUs per pod")
    gpu_model: list[str] = Field(default_factory=list, alias="gpuModel", description="allowed GPU models")
    gpu_share: GpuShare | None = Field(default=None, alias="gpuShare")
    mig: str | None = Field(default=None, description="MIG profile, e.g. 1g.10gb")
    cpu_milli: int = Field(default=1000, alias="cpuMilli", ge=0, le=10_000_000)
    memory_mib: int = Field(default=1024, alias="memoryMiB", ge=0, le=64 * 1024 * 1024)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        return normalize_resources(data) if isinstance(data, dict) else data

    @field_validator("gpu_model")
    @classmethod
    def _gfd_models(cls, value: list[str]) -> list[str]:
        return [gpu_model_name(m) for m in value]

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


def job_spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (what docs/jobspec.schema.json holds; `tide schema` prints it)."""
    schema = JobSpec.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
