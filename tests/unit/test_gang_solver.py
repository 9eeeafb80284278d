"""The topology-aware gang solver (pure): hard limits, closeness, bin-packing, explanations."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from tide.core import Cluster, PodRequest, Unfit
from tide.core.gang import place_gang
from tide.core.gang_optimum import optimum_cost
from tide.core.model import MILLI, Allocation
from tide.core.topology import Level
from tide.schemas.node import default_h100_node

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gang_quality import random_cluster  # noqa: E402

ONE_GPU = PodRequest(gpu_count=1, cpu_milli=1000, memory_mib=1024)


def cluster(racks: int = 2, per_rack: int = 2) -> Cluster:
    nodes = [default_h100_node(f"r{r}n{i}", rack=f"r{r}") for r in range(racks) for i in range(per_rack)]
    return Cluster.from_descriptions(nodes)


def take(c: Cluster, node: str, gpus: list[int]) -> None:
    c.allocate(Allocation(node_id=node, gpu_indices=tuple(gpus), gpu_milli=(MILLI,) * len(gpus),
                          gpu_mem_mib=(81559,) * len(gpus)))


def test_gang_that_fits_one_node_stays_on_one_node_and_is_allocatable() -> None:
    c = cluster()
    plan = place_gang(c, ONE_GPU, 8)
    assert {a.node_id for a in plan.allocations} == {"r0n0"}
    assert plan.span == Level.NVLINK
    for a in plan.allocations:  # the plan is real: every allocation applies
        c.allocate(a)
    c.check_consistency()


def test_require_is_a_hard_limit_and_the_reason_names_the_best_domain() -> None:
    c = cluster()
    take(c, "r0n0", [0, 1, 2, 3, 4])
    take(c, "r1n0", [0, 1, 2, 3, 4])
    plan = place_gang(c, ONE_GPU, 12, require=Level.RACK)
    assert isinstance(plan, Unfit) and plan.resolvable
    assert plan.reason == "needs 12 pods within one rack; the best rack has room for 11"
    ok = place_gang(c, ONE_GPU, 12)  # without the limit it spans racks
    assert not isinstance(ok, Unfit) and ok.span >= Level.SPINE
    fits = place_gang(c, ONE_GPU, 11, require=Level.RACK)
    assert not isinstance(fits, Unfit)
    assert len({a.node_id[:2] for a in fits.allocations}) == 1


def test_closeness_first_then_bin_packing_into_the_fullest_domain() -> None:
    c = cluster()
    take(c, "r1n0", [0, 1, 2, 3])
    take(c, "r1n1", [0, 1, 2, 3])
    # 8 pods: one whole free node (all NVLink) beats 4 + 4 across two nodes, closeness comes first
    plan = place_gang(c, ONE_GPU, 8, require=Level.RACK)
    assert not isinstance(plan, Unfit)
    assert {a.node_id for a in plan.allocations} == {"r0n0"}
    # 4 pods: equally close anywhere, so they go where the node is already busy; whole nodes stay free
    small = place_gang(c, ONE_GPU, 4)
    assert not isinstance(small, Unfit)
    assert len({a.node_id for a in small.allocations}) == 1
    assert small.allocations[0].node_id in {"r1n0", "r1n1"}


def test_prefer_nvlink_keeps_pods_on_one_numa_when_possible() -> None:
    c = cluster(racks=1, per_rack=1)
    take(c, "r0n0", [0])
    plan = place_gang(c, ONE_GPU, 3, prefer=Level.NVLINK)
    assert not isinstance(plan, Unfit)
    assert len({c.numa[0, a.gpu_indices[0]] for a in plan.allocations}) == 1


def test_solver_is_near_the_exhaustive_optimum_on_random_small_topologies() -> None:
    rng = random.Random(11)
    ratios = []
    while len(ratios) < 60:
        c = random_cluster(rng)
        req = PodRequest(gpu_count=rng.choice([1, 2]), cpu_milli=1000, memory_mib=1024)
        n = rng.randint(2, 9)
        best = optimum_cost(c, req, n)
        plan = place_gang(c, req, n)
        if best is None:
            assert isinstance(plan, Unfit)
            continue
        assert not isinstance(plan, Unfit)
        assert plan.cost >= best - 1e-9  # the optimum really is a lower bound
        ratios.append(plan.cost / best if best else 1.0)
    assert sum(ratios) / len(ratios) <= 1.02
    assert max(ratios) <= 1.10
