"""The placer applies the feedback loop's family weights (pure part)."""

from __future__ import annotations

from tide.core.job_placement import pod_request, topology_levels
from tide.core.topology import Level
from tide.schemas.feedback import APPLIED_MULTIPLIER_LABEL, FamilyWeights
from tide.schemas.job import JobSpec


def spec(memory: int = 10240, labels: dict | None = None, topology: dict | None = None) -> JobSpec:
    return JobSpec.model_validate({
        "metadata": {"name": "j", "labels": labels or {"family": "f"}},
        "spec": {"topology": topology or {}, "template": {"command": ["x"], "resources": {
            "gpuShare": {"memoryMiB": memory, "smPercent": 20}}}},
    })


def test_memory_multiplier_raises_a_share_once_and_caps_at_the_gpu() -> None:
    weights = FamilyWeights(family="f", memory_multiplier=1.5)
    assert pod_request(spec()).gpu_mem_mib == 10240
    assert pod_request(spec(), weights, 81920).gpu_mem_mib == 15360
    # a resubmission already carries x1.5 in its spec: not multiplied twice
    resubmitted = spec(15360, labels={"family": "f", APPLIED_MULTIPLIER_LABEL: "1.5"})
    assert pod_request(resubmitted, weights, 81920).gpu_mem_mib == 15360
    assert pod_request(spec(60000), FamilyWeights(family="f", memory_multiplier=4), 81920).gpu_mem_mib == 81920


def test_affinity_makes_a_family_prefer_one_node_unless_it_says_otherwise() -> None:
    close = FamilyWeights(family="f", affinity=1.0)
    assert topology_levels(spec()) == (None, None)
    assert topology_levels(spec(), close) == (None, Level.NODE)
    assert topology_levels(spec(), FamilyWeights(family="f", affinity=0.5)) == (None, None)
    assert topology_levels(spec(topology={"prefer": "nvlink"}), close) == (None, Level.NVLINK)
