from __future__ import annotations

import numpy as np
import pytest
from tide.core import Allocation, Cluster, MigAssignment, OversubscriptionError, PodRequest


def snapshot(c: Cluster) -> tuple:
    return (c.cpu_free.copy(), c.mem_free.copy(), c.milli_free.copy(), c.gpu_mem_free.copy(),
            c.mig_enabled.copy(), {k: dict(v) for k, v in c.mig_instances.items()})


def same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a[:5], b[:5], strict=True)) and a[5] == b[5]


def test_capacity_from_descriptions(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    assert c.num_nodes == 5
    assert c.gpu_capacity_milli == (2 + 4 + 8 + 8) * 1000
    assert c.allocated_gpu_milli() == 0
    assert c.gpu_exists[c.index["cpu-only"]].sum() == 0


@pytest.mark.parametrize(
    "alloc",
    [
        Allocation("t4-a", cpu_milli=32001),
        Allocation("t4-a", memory_mib=65537),
        Allocation("t4-a", gpu_indices=(0,), gpu_milli=(1001,), gpu_mem_mib=(0,)),
        Allocation("t4-a", gpu_indices=(0,), gpu_milli=(500,), gpu_mem_mib=(15001,)),
        Allocation("t4-a", gpu_indices=(2,), gpu_milli=(1000,), gpu_mem_mib=(15000,)),
        Allocation("t4-a", gpu_indices=(0, 0), gpu_milli=(500, 500), gpu_mem_mib=(0, 0)),
        Allocation("nope"),
    ],
)
def test_allocate_rejects_oversubscription_and_changes_nothing(small_nodes, alloc):
    c = Cluster.from_descriptions(small_nodes)
    before = snapshot(c)
    with pytest.raises(OversubscriptionError):
        c.allocate(alloc)
    assert same(before, snapshot(c))


def test_shares_never_oversubscribe_milli_or_memory(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    c.allocate(Allocation("t4-a", gpu_indices=(0,), gpu_milli=(600,), gpu_mem_mib=(4000,)))
    with pytest.raises(OversubscriptionError, match="milli"):
        c.allocate(Allocation("t4-a", gpu_indices=(0,), gpu_milli=(500,), gpu_mem_mib=(1000,)))
    with pytest.raises(OversubscriptionError, match="memory"):
        c.allocate(Allocation("t4-a", gpu_indices=(0,), gpu_milli=(100,), gpu_mem_mib=(11001,)))
    c.allocate(Allocation("t4-a", gpu_indices=(0,), gpu_milli=(400,), gpu_mem_mib=(11000,)))
    assert c.milli_free[0, 0] == 0 and c.gpu_mem_free[0, 0] == 0
    c.check_consistency()


def test_whole_gpu_needs_an_untouched_gpu(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    c.allocate(Allocation("t4-a", gpu_indices=(0,), gpu_milli=(100,), gpu_mem_mib=(0,)))
    with pytest.raises(OversubscriptionError):
        c.allocate(Allocation("t4-a", gpu_indices=(0,), gpu_milli=(1000,), gpu_mem_mib=(15000,)))


def test_release_exactly_undoes_allocate(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    before = snapshot(c)
    a = Allocation("v100", gpu_indices=(1, 2), gpu_milli=(1000, 1000), gpu_mem_mib=(32510, 32510),
                   cpu_milli=8000, memory_mib=1024)
    c.allocate(a)
    assert c.allocated_gpu_milli() == 2000
    c.release(a)
    assert same(before, snapshot(c))
    with pytest.raises(OversubscriptionError):
        c.release(a)  # not held any more


def test_copy_is_independent(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    d = c.copy()
    d.allocate(Allocation("t4-a", cpu_milli=1000))
    assert c.cpu_free[0] == 32000 and d.cpu_free[0] == 31000


def test_allocation_json_round_trip():
    a = Allocation("h100", mig=MigAssignment(3, "3g.40gb", 4, True, (("1g.10gb", 4),), False),
                   cpu_milli=100, memory_mib=10)
    assert Allocation.from_dict(a.to_dict()) == a


def test_pod_request_validation():
    with pytest.raises(ValueError):
        PodRequest(gpu_count=1, gpu_milli=500)
    with pytest.raises(ValueError):
        PodRequest(gpu_milli=1000)
    assert PodRequest(node_selector={"b": "2", "a": "1"}).node_selector == (("a", "1"), ("b", "2"))


def test_from_resources_maps_share_and_mig():
    from tide.schemas.job import Resources

    r = Resources.model_validate({"gpuShare": {"memoryMiB": 8000, "smPercent": 30}, "gpuModel": ["T4"],
                                  "cpuMilli": 2000, "memoryMiB": 4096})
    req = PodRequest.from_resources(r, {"pool": "inference"})
    assert (req.gpu_milli, req.gpu_mem_mib, req.gpu_models, req.kind) == (300, 8000, ("T4",), "share")
    assert req.selector == {"pool": "inference"}
    m = PodRequest.from_resources(Resources.model_validate({"mig": "1g.10gb"}), {})
    assert m.kind == "mig" and m.mig_profile == "1g.10gb"
