"""The placer applies the feedback loop's family weights (pure part)."""

from __future__ import annotations

from tide.core import Cluster, Placer
from tide.core.cycle import CycleState, plan_cycle
from tide.core.job_placement import pod_request, topology_levels
from tide.core.topology import Level
from tide.schemas.events import JobRecord, PodRecord
from tide.schemas.feedback import APPLIED_MULTIPLIER_LABEL, FamilyWeights
from tide.schemas.job import JobSpec

from tests.helpers import small_node


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


def test_a_cycle_places_a_family_with_its_weights_and_others_without() -> None:
    """``plan_cycle`` looks up each pending job's family in the loop's weights: the family with a memory
    multiplier gets its raised share (and its bind carries the weights), another family its own request."""
    nodes = [small_node("n0", gpus=2)]
    pending = [JobRecord(job_id=name, spec=spec(labels={"family": name}), submitted_at=0.0, updated_at=0.0,
                         pods=[PodRecord(name=f"{name}-0", index=0)]) for name in ("f", "g")]
    weights = {"f": FamilyWeights(family="f", memory_multiplier=1.5)}
    plan = plan_cycle(CycleState(nodes=nodes, cluster=Cluster.from_descriptions(nodes), pending=pending,
                                 running={}, now=10.0, weights=weights), Placer())
    by_job = {b.record.job_id: b for b in plan.binds}
    assert by_job["f"].placements[0].alloc.gpu_mem_mib == (15360,) and by_job["f"].feedback == weights["f"]
    assert by_job["g"].placements[0].alloc.gpu_mem_mib == (10240,) and by_job["g"].feedback is None
