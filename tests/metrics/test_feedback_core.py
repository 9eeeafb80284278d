"""The feedback loop's pure decisions (tide.core.feedback)."""

from __future__ import annotations

from tide.core.feedback import (
    APPLIED_LABEL,
    FeedbackPolicy,
    JobGpu,
    PodBytes,
    after_clean_run,
    after_oom,
    after_traffic,
    effective_share_mib,
    far_traffic_bytes,
    may_change_affinity,
    resubmission,
    resubmit_id,
)
from tide.schemas.feedback import AFFINITY_PREFER_NODE, FamilyWeights
from tide.schemas.job import JobSpec

GIB = 1024**3


def spec(share_mib: int | None = 10240, labels: dict | None = None, gpu: int = 0) -> JobSpec:
    res: dict = {"gpu": gpu} if gpu else {"gpuShare": {"memoryMiB": share_mib, "smPercent": 30}}
    return JobSpec.model_validate({"metadata": {"name": "fam", "labels": labels or {"family": "f"}},
                                   "spec": {"template": {"command": ["x"], "resources": res}}})


def test_oom_raises_by_a_step_and_explains() -> None:
    w = after_oom(None, "f", job_id="j1", request_mib=10240, device_mib=81920, peak_bytes=8 * GIB, now=1.0)
    assert w.memory_multiplier == 1.5 and w.clean_runs == 0 and w.updated_at == 1.0
    assert w.evidence == ("job j1 OOM, request 10.0 GiB, peak 8.0 GiB, device 80.0 GiB: "
                          "memory multiplier 1 -> 1.5 (x1.5)")
    again = after_oom(w, "f", job_id="j2", request_mib=10240, device_mib=81920)
    assert again.memory_multiplier == 2.25


def test_oom_raise_follows_a_measured_peak_above_the_step() -> None:
    w = after_oom(None, "f", job_id="j", request_mib=10240, device_mib=81920, peak_bytes=20 * GIB)
    assert w.memory_multiplier == round(20 * 1.1 / 10, 4)
    assert "peak 20.0 GiB x1.1" in w.evidence


def test_oom_is_capped_at_the_device_size_and_the_maximum() -> None:
    w = FamilyWeights(family="f", memory_multiplier=6.0)
    capped = after_oom(w, "f", job_id="j", request_mib=10240, device_mib=81920)
    assert capped.memory_multiplier == 8.0 and "capped" in capped.evidence
    small = after_oom(None, "f", job_id="j", request_mib=40960, device_mib=49152)
    assert small.memory_multiplier == 1.2 and "capped at the device size" in small.evidence
    assert effective_share_mib(40960, 1.5, 49152) == 49152


def test_decay_starts_after_two_clean_runs_and_returns_to_one_slowly() -> None:
    w = FamilyWeights(family="f", memory_multiplier=1.5)
    first = after_clean_run(w, job_id="a")
    assert first is not None and first.memory_multiplier == 1.5 and first.clean_runs == 1
    second = after_clean_run(first, job_id="b")
    assert second is not None and second.memory_multiplier == 1.4 and second.clean_runs == 2
    assert "2 clean run(s)" in second.evidence and "1.5 -> 1.4" in second.evidence
    m, cur = [], second
    for i in range(30):
        cur = after_clean_run(cur, job_id=f"c{i}") or cur
        m.append(cur.memory_multiplier)
    assert m == sorted(m, reverse=True) and m[-1] == 1.0
    assert after_clean_run(cur, job_id="z") is None  # nothing left to decay
    assert after_clean_run(None, job_id="z") is None


def test_decay_never_goes_below_the_measured_peak() -> None:
    w = FamilyWeights(family="f", memory_multiplier=1.5, clean_runs=1)
    kept = after_clean_run(w, job_id="b", request_mib=10240, peak_bytes=13 * GIB)
    assert kept is not None and kept.memory_multiplier == round(13 * 1.1 / 10, 4)


def test_traffic_raises_affinity_to_prefer_node_and_is_bounded() -> None:
    policy = FeedbackPolicy(traffic_bytes_per_s=1e9)
    w = after_traffic(None, "f", job_id="j", far_bytes=20e9, seconds=4, nodes=2, policy=policy)
    assert w is not None and w.affinity == AFFINITY_PREFER_NODE
    assert "5.00 GB/s" in w.evidence and "prefers one node" in w.evidence
    for _ in range(10):
        w = after_traffic(w, "f", job_id="j", far_bytes=20e9, seconds=4, nodes=2, policy=policy) or w
    assert w.affinity == policy.max_affinity
    assert after_traffic(w, "f", job_id="k", far_bytes=0, seconds=4, nodes=1) is None  # close run: kept
    lower = after_traffic(w, "f", job_id="k", far_bytes=1e6, seconds=4, nodes=2)
    assert lower is not None and lower.affinity == policy.max_affinity - 1
    assert after_traffic(None, "f", job_id="j", far_bytes=1e6, seconds=4, nodes=2) is None
    assert after_traffic(None, "f", job_id="j", far_bytes=1e12, seconds=0, nodes=2) is None


def test_far_traffic_counts_cross_node_and_cross_switch_pairs_only() -> None:
    spread = [JobGpu("p0", "n0", 0, 0, None), JobGpu("p1", "n1", 0, 0, None)]
    usage = [PodBytes("p0", 10e9), PodBytes("p1", 10e9)]
    assert far_traffic_bytes(spread, usage) == 20e9
    nvlinked = [JobGpu("p0", "n0", 0, 0, 0), JobGpu("p1", "n0", 4, 2, 0)]
    assert far_traffic_bytes(nvlinked, usage) == 0
    switches = [JobGpu("p0", "n0", 0, 0, None), JobGpu("p1", "n0", 4, 2, None)]
    assert far_traffic_bytes(switches, usage) == 20e9
    three = [JobGpu("p0", "n0"), JobGpu("p1", "n0"), JobGpu("p2", "n1")]
    got = far_traffic_bytes(three, [PodBytes("p0", 9.0), PodBytes("p1", 9.0), PodBytes("p2", 9.0)])
    assert got == 4.5 + 4.5 + 9.0
    measured = far_traffic_bytes(spread, [PodBytes("p0", 10e9, network_bytes=3), PodBytes("p1", 10e9, 4)])
    assert measured == 7


def test_a_lone_pod_on_one_gpu_never_changes_affinity_so_its_traffic_is_not_weighed() -> None:
    """``may_change_affinity`` says no only where ``after_traffic`` could change nothing: one pod, one GPU (a
    share or a whole one), whatever its bytes and its family's weights; yes for two GPUs or two pods, and for
    every job once the policy calls any traffic heavy."""
    lone = JobGpu("p0", "n0", 0, 0, None)
    weights = [None, FamilyWeights(family="f", affinity=0.5), FamilyWeights(family="f", affinity=1.0)]
    for one in (spec(), spec(gpu=1)):
        assert not may_change_affinity(one)
        for w in weights:
            for bytes_ in (0.0, 1e9, 1e15):
                far = far_traffic_bytes([lone], [PodBytes("p0", bytes_, network_bytes=int(bytes_))])
                assert after_traffic(w, "f", job_id="j", far_bytes=far, seconds=4, nodes=1) is None
    two_pods = JobSpec.model_validate({"metadata": {"name": "g"}, "spec": {"replicas": 2, "template": {
        "command": ["x"], "resources": {"gpu": 1}}}})
    assert may_change_affinity(spec(gpu=2)) and may_change_affinity(two_pods)
    eager = FeedbackPolicy(traffic_bytes_per_s=0)
    assert may_change_affinity(spec(), eager)
    assert after_traffic(None, "f", job_id="j", far_bytes=0, seconds=4, nodes=1, policy=eager) is not None


def test_resubmission_has_a_deterministic_id_and_a_multiplied_share_applied_once() -> None:
    assert resubmit_id("train-1") == ("train-1-r1", 1)
    assert resubmit_id("train-1-r1") == ("train-1-r2", 2)
    assert len(resubmit_id("a" * 63)[0]) <= 63
    new_id, body, why = resubmission("train-1", spec(), 1.5, 81920)
    assert new_id == "train-1-r1"
    assert body["spec"]["template"]["resources"]["gpuShare"]["memoryMiB"] == 15360
    assert body["metadata"]["labels"] == {"family": "f", APPLIED_LABEL: "1.5"}
    assert "15.0 GiB share (was 10.0 GiB)" in why
    again = JobSpec.model_validate(body)
    new_id2, body2, _ = resubmission(new_id, again, 2.25, 81920)
    assert new_id2 == "train-1-r2"
    assert body2["spec"]["template"]["resources"]["gpuShare"]["memoryMiB"] == 23040  # 10 GiB x 2.25, not x 3.375
    assert resubmission("train-1", spec(), 1.0, 81920) is None  # nothing larger to try
    assert resubmission("train-1", spec(gpu=1), 1.5, 81920) is None  # a whole GPU cannot grow
    assert resubmission("train-1-r3", spec(), 1.5, 81920) is None  # bounded
    assert resubmission("t", spec(81920), 1.5, 81920) is None  # already the whole device
