from __future__ import annotations

import pytest
from tide.core import Allocation, Cluster, MigAssignment, OversubscriptionError, Placer, PodRequest, profiles_for
from tide.core.mig import PROFILES_BY_MODEL

from .conftest import gpu_node


def a100_cluster(n_gpus: int = 1) -> Cluster:
    return Cluster.from_descriptions([gpu_node("a", "A100-40GB", n_gpus, gpu_mem=40960, mig=True)])


def test_profile_placement_rules():
    t = profiles_for("A100-40GB")
    assert t["3g.20gb"].starts == (0, 4)
    assert t["2g.10gb"].starts == (0, 2, 4)
    assert t["1g.5gb"].starts == tuple(range(7))
    assert set(PROFILES_BY_MODEL) == {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"}


def test_dynamic_mig_repartitions_an_idle_gpu():
    c = a100_cluster()
    p = Placer("bestfit")
    a = p.place(c, PodRequest(mig_profile="3g.20gb"))
    assert isinstance(a, Allocation) and a.requires_repartition and a.mig.enables_mig
    c.allocate(a)
    b = p.place(c, PodRequest(mig_profile="3g.20gb"))
    assert isinstance(b, Allocation) and {a.mig.start, b.mig.start} == {0, 4} and not b.mig.enables_mig
    c.allocate(b)
    assert not isinstance(p.place(c, PodRequest(mig_profile="1g.5gb")), Allocation)  # 6 slices, 8 slots used
    c.check_consistency()
    # the GPU is in MIG mode now: no whole GPU or share on it
    assert not isinstance(p.place(c, PodRequest(gpu_milli=100)), Allocation)


def test_seven_1g_instances_then_full():
    c = a100_cluster()
    p = Placer()
    starts = []
    for _ in range(7):
        a = p.place(c, PodRequest(mig_profile="1g.5gb"))
        assert isinstance(a, Allocation)
        c.allocate(a)
        starts.append(a.mig.start)
    assert sorted(starts) == list(range(7))
    assert isinstance(p.place(c, PodRequest(mig_profile="1g.5gb")), type(p.place(c, PodRequest(gpu_count=99))))


def test_release_undoes_a_repartition():
    c = a100_cluster()
    p = Placer()
    a = p.place(c, PodRequest(mig_profile="2g.10gb"))
    c.allocate(a)
    c.release(a)
    assert not c.mig_enabled[0, 0] and c.milli_free[0, 0] == 1000 and not c.mig_instances


def described_a100(instances: list[tuple[str, int]]) -> Cluster:
    from tide.schemas.node import MigInstanceDescription

    node = gpu_node("a", "A100-40GB", 1, gpu_mem=40960, mig=True)
    node.gpus[0].mig_enabled = True
    node.gpus[0].mig_instances = [MigInstanceDescription(profile=p, start=s) for p, s in instances]
    return Cluster.from_descriptions([node])


def test_existing_idle_instance_is_reused_without_repartition():
    c = described_a100([("2g.10gb", 0), ("2g.10gb", 2)])
    a = Placer().place(c, PodRequest(mig_profile="2g.10gb"))
    assert isinstance(a, Allocation) and not a.requires_repartition and a.mig.start in (0, 2)
    c.allocate(a)
    c.release(a)
    assert c.mig_instances[(0, 0)] == {("2g.10gb", 0): False, ("2g.10gb", 2): False}


def test_illegal_mig_placements_are_rejected():
    c = a100_cluster()
    bad = [
        MigAssignment(0, "3g.20gb", 2, repartition=True, enables_mig=True),  # 3g only at 0 or 4
        MigAssignment(0, "4g.20gb", 4, repartition=True, enables_mig=True),
        MigAssignment(0, "1g.18gb", 0, repartition=True, enables_mig=True),  # H200 profile on A100
        MigAssignment(0, "1g.5gb", 0, repartition=False),  # no such instance
    ]
    for mig in bad:
        with pytest.raises(OversubscriptionError):
            c.allocate(Allocation("a", mig=mig))
    c.allocate(Allocation("a", mig=MigAssignment(0, "4g.20gb", 0, True, enables_mig=True)))
    with pytest.raises(OversubscriptionError):  # 4 + 4 compute slices > 7
        c.allocate(Allocation("a", mig=MigAssignment(0, "3g.20gb", 0, True)))
    c.allocate(Allocation("a", mig=MigAssignment(0, "3g.20gb", 4, True)))
    c.check_consistency()


def test_repartition_destroys_only_idle_instances_and_release_restores_them():
    c = described_a100([("1g.5gb", s) for s in range(7)])
    before = {k: dict(v) for k, v in c.mig_instances.items()}
    busy = Allocation("a", mig=MigAssignment(0, "1g.5gb", 0))
    c.allocate(busy)
    a = Placer().place(c, PodRequest(mig_profile="3g.20gb"))
    assert isinstance(a, Allocation) and a.requires_repartition and a.mig.start == 4
    assert sorted(a.mig.destroyed) == [("1g.5gb", 4), ("1g.5gb", 5), ("1g.5gb", 6)]
    c.allocate(a)
    c.check_consistency()
    c.release(a)
    c.release(busy)
    assert c.mig_instances == before
