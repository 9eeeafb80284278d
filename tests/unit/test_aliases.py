"""Job spec aliases: Kubernetes / NVIDIA device plugin / HAMi resource names, quantities, GFD model names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from tide.schemas.job import (
    JobSpec,
    Resources,
    cpu_milli,
    gpu_model_name,
    job_spec_json_schema,
    memory_mib,
    normalize_resources,
)

ROOT = Path(__file__).resolve().parents[2]


def resources(**raw: object) -> Resources:
    return Resources.model_validate(raw)


def test_nvidia_gpu_is_gpu() -> None:
    assert resources(**{"nvidia.com/gpu": 2}).gpu == 2
    with pytest.raises(ValidationError, match="nvidia.com/gpu and gpu are the same resource"):
        resources(**{"nvidia.com/gpu": 2, "gpu": 2})
    with pytest.raises(ValidationError, match="less than or equal to 16"):
        resources(**{"nvidia.com/gpu": 17})


def test_mig_resource_name_is_a_mig_profile() -> None:
    r = resources(**{"nvidia.com/mig-1g.10gb": 1})
    assert (r.mig, r.gpu_kind) == ("1g.10gb", "mig")
    with pytest.raises(ValidationError, match="must be 1"):
        resources(**{"nvidia.com/mig-1g.10gb": 2})
    with pytest.raises(ValidationError, match="unknown MIG profile"):
        resources(**{"nvidia.com/mig-9g.99gb": 1})
    with pytest.raises(ValidationError, match="one MIG instance"):
        resources(**{"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1})


def test_hami_gpumem_and_gpucores_are_a_share() -> None:
    r = resources(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10240, "nvidia.com/gpucores": 30})
    assert r.gpu == 0 and r.gpu_share is not None
    assert (r.gpu_share.memory_mib, r.gpu_share.sm_percent) == (10240, 30)
    assert resources(**{"nvidia.com/gpumem": 4096}).gpu_share.sm_percent == 100  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="must be 1"):
        resources(**{"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4096})
    with pytest.raises(ValidationError, match="needs nvidia.com/gpumem"):
        resources(**{"nvidia.com/gpucores": 30})
    with pytest.raises(ValidationError, match="less than or equal to 100"):
        resources(**{"nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 130})


@pytest.mark.parametrize(("quantity", "milli"), [("500m", 500), ("16", 16000), (16, 16000), ("1.5", 1500),
                                                 (0.25, 250), ("2e3m", 2000)])
def test_cpu_quantities(quantity: object, milli: int) -> None:
    assert cpu_milli(quantity) == milli
    assert resources(cpu=quantity).cpu_milli == milli


@pytest.mark.parametrize(("quantity", "mib"), [("64Gi", 65536), ("512Mi", 512), ("1Ti", 1024 * 1024),
                                               ("1G", 954), (1073741824, 1024), ("1073741824", 1024)])
def test_memory_quantities(quantity: object, mib: int) -> None:
    assert memory_mib(quantity) == mib
    assert resources(memory=quantity).memory_mib == mib


@pytest.mark.parametrize("bad", ["64GB", "lots", "-1", "", True, [1]])
def test_bad_quantities_name_the_field(bad: object) -> None:
    with pytest.raises(ValidationError, match="memory: .* not a"):
        resources(memory=bad)
    with pytest.raises(ValidationError, match="same resource"):
        resources(memory="1Gi", memoryMiB=1024)


@pytest.mark.parametrize(("gfd", "tide"), [
    ("NVIDIA-H100-80GB-HBM3", "H100-80GB"), ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA-A100-PCIE-40GB", "A100-40GB"), ("NVIDIA-H200", "H200-141GB"), ("Tesla-V100-SXM2-16GB", "V100M16"),
    ("Tesla-T4", "T4"), ("NVIDIA-L40S", "L40S"), ("H100-80GB", "H100-80GB"), ("G2", "G2"),
])
def test_gfd_model_names(gfd: str, tide: str) -> None:
    assert gpu_model_name(gfd) == tide
    assert resources(gpu=1, gpuModel=[gfd]).gpu_model == [tide]


def test_a_spec_with_aliases_is_stored_in_canonical_form() -> None:
    spec = JobSpec.model_validate({"metadata": {"name": "k8s"}, "spec": {"template": {
        "command": ["true"], "resources": {"nvidia.com/gpu": 2, "memory": "64Gi", "cpu": "8"}}}})
    dumped = spec.model_dump(by_alias=True, mode="json")["spec"]["template"]["resources"]
    assert (dumped["gpu"], dumped["memoryMiB"], dumped["cpuMilli"]) == (2, 65536, 8000)
    assert JobSpec.model_validate(spec.model_dump(by_alias=True, mode="json")) == spec


def test_unknown_keys_are_still_rejected() -> None:
    assert normalize_resources({"gpus": 1}) == {"gpus": 1}
    with pytest.raises(ValidationError, match="gpus"):
        resources(gpus=1)


def test_published_json_schema_is_up_to_date() -> None:
    """docs/jobspec.schema.json is generated: `tide schema > docs/jobspec.schema.json`."""
    published = json.loads((ROOT / "docs" / "jobspec.schema.json").read_text())
    assert published == job_spec_json_schema(), "run: .venv/bin/tide schema > docs/jobspec.schema.json"
    resources_schema = published["$defs"]["Resources"]
    assert {"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "cpu", "memory"} <= set(
        resources_schema["properties"])
