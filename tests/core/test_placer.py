from __future__ import annotations

import numpy as np
import pytest
from tide.core import (
    DEFAULT_POLICY,
    POLICIES,
    Allocation,
    Cluster,
    Placer,
    PodRequest,
    TypicalPods,
    Unfit,
    never_fits,
)
from tide.core.plugins.base import Candidates, Context
from tide.core.plugins.topology_score import TopologyScore

from tests.core.conftest import gpu_node


def place_ok(placer: Placer, c: Cluster, req: PodRequest) -> Allocation:
    res = placer.place(c, req)
    assert isinstance(res, Allocation), res
    c.allocate(res)
    return res


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_places_every_kind_validly(small_nodes, policy):
    c = Cluster.from_descriptions(small_nodes)
    wl = TypicalPods.from_requests([PodRequest(cpu_milli=1000, gpu_count=1), PodRequest(cpu_milli=1000, gpu_milli=500)])
    p = Placer(policy, workload=wl)
    for req in (PodRequest(cpu_milli=1000, gpu_count=2), PodRequest(cpu_milli=500, gpu_milli=300),
                PodRequest(cpu_milli=2000, memory_mib=100), PodRequest(gpu_count=1, gpu_models=("V100M32",))):
        place_ok(p, c, req)
    c.check_consistency()


def test_default_policy_is_registered():
    assert DEFAULT_POLICY in POLICIES


def test_model_constraint(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    p = Placer("bestfit")
    for _ in range(8):
        a = place_ok(p, c, PodRequest(gpu_count=1, gpu_models=("V100M32",)))
        assert a.node_id == "v100"
    res = p.place(c, PodRequest(gpu_count=1, gpu_models=("V100M32",)))
    assert isinstance(res, Unfit) and res.resolvable
    assert "V100M32" in res.reason


def test_selector_constraint(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    p = Placer("worstfit")
    a = place_ok(p, c, PodRequest(gpu_count=1, node_selector={"pool": "inference"}))
    assert a.node_id == "t4-b"
    res = p.place(c, PodRequest(gpu_count=1, node_selector={"pool": "nowhere"}))
    assert isinstance(res, Unfit) and not res.resolvable and "selector" in res.reason


@pytest.mark.parametrize(
    ("req", "fragment"),
    [
        (PodRequest(gpu_count=9), "largest node has 8"),
        (PodRequest(gpu_count=1, gpu_models=("B200",)), "B200"),
        (PodRequest(cpu_milli=10**7), "CPU"),
        (PodRequest(memory_mib=10**8), "memory"),
        (PodRequest(gpu_milli=100, gpu_mem_mib=100_000), "MiB"),
        (PodRequest(mig_profile="1g.10gb", gpu_models=("T4",)), "MIG"),
    ],
)
def test_never_fits(small_nodes, req, fragment):
    c = Cluster.from_descriptions(small_nodes)
    reason = never_fits(c, req)
    assert reason is not None and fragment in reason
    res = Placer().place(c, req)
    assert isinstance(res, Unfit) and not res.resolvable


def test_resolvable_unfit_when_busy(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    p = Placer("bestfit")
    for _ in range(2):
        place_ok(p, c, PodRequest(gpu_count=8))
    res = p.place(c, PodRequest(gpu_count=8))
    assert isinstance(res, Unfit) and res.resolvable and res.reason.startswith("0/5 nodes fit")


def test_cpu_and_memory_never_oversubscribed(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    p = Placer("worstfit")
    placed = 0
    while isinstance(res := p.place(c, PodRequest(cpu_milli=7000, memory_mib=30000)), Allocation):
        c.allocate(res)
        placed += 1
    assert placed > 0 and (c.cpu_free >= 0).all() and (c.mem_free >= 0).all()
    assert ((c.cpu_free < 7000) | (c.mem_free < 30000)).all()


def test_share_packs_within_gpu_memory_and_milli(small_nodes):
    c = Cluster.from_descriptions(small_nodes[:1])  # t4-a: 2 GPUs x 15000 MiB
    p = Placer("bestfit")
    allocs = []
    while isinstance(res := p.place(c, PodRequest(gpu_milli=300, gpu_mem_mib=6000)), Allocation):
        c.allocate(res)
        allocs.append(res)
    assert len(allocs) == 4  # memory binds (2 per GPU), not milli (3 per GPU)
    c.check_consistency()


def test_bestfit_prefers_the_tighter_node(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    a = place_ok(Placer("bestfit"), c, PodRequest(gpu_count=1, cpu_milli=1000))
    assert a.node_id == "t4-a"


def test_fgd_puts_shares_on_a_shared_gpu(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    wl = TypicalPods.from_requests([PodRequest(cpu_milli=1000, gpu_count=1)] * 3 + [PodRequest(gpu_milli=500)])
    p = Placer("fgd", workload=wl)
    first = place_ok(p, c, PodRequest(gpu_milli=500))
    second = place_ok(p, c, PodRequest(gpu_milli=500))
    assert (second.node_id, second.gpu_indices) == (first.node_id, first.gpu_indices)


def test_weights_update_at_run_time(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    p = Placer("bestfit")
    assert place_ok(p, c.copy(), PodRequest(gpu_count=1)).node_id == "t4-a"
    p.set_weights({"bestfit": 0, "worstfit": 1})
    assert p.place(c, PodRequest(gpu_count=1)).node_id in {"v100", "h100"}
    with pytest.raises(ValueError):
        p.set_weights({"nope": 1})


def test_place_does_not_mutate(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    v = c.cpu_free.copy(), c.milli_free.copy()
    Placer().place(c, PodRequest(gpu_count=2, cpu_milli=100))
    assert (c.cpu_free == v[0]).all() and (c.milli_free == v[1]).all()


def test_whole_gpus_are_picked_close_together(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    c.allocate(Allocation("h100", gpu_indices=(0,), gpu_milli=(1000,), gpu_mem_mib=(81559,)))
    p = Placer("topology")
    a = place_ok(p, c, PodRequest(gpu_count=2, node_selector={"pool": "training"}, gpu_models=("H100-80GB",)))
    assert a.gpu_indices in {(2, 3), (4, 5), (6, 7)}  # a full PCIe-switch pair, not (1, 2)


def _split_pair_nodes() -> Cluster:
    """Two alike 4 x T4 nodes (PCIe switch = index // 2) with two free GPUs each: node "a" (first in node
    order) has GPUs 1 and 2 free, on two PCIe switches; node "b" has GPUs 2 and 3, on one switch."""
    c = Cluster.from_descriptions([gpu_node("a", n=4), gpu_node("b", n=4)])
    for node, taken in (("a", (0, 3)), ("b", (0, 1))):
        c.allocate(Allocation(node, gpu_indices=taken, gpu_milli=(1000, 1000), gpu_mem_mib=(15000, 15000)))
    return c


@pytest.mark.parametrize("cache", [True, False])
def test_topology_policy_prefers_the_node_whose_free_gpus_are_closer(cache):
    """The node choice, not only the GPUs inside a node: without the topology score both nodes tie and
    the first in node order ("a", GPUs 1 and 2 across two switches) wins."""
    req = PodRequest(gpu_count=2)
    assert place_ok(Placer("bestfit", cache=cache), _split_pair_nodes(), req).node_id == "a"
    a = place_ok(Placer("topology", cache=cache), _split_pair_nodes(), req)
    assert (a.node_id, a.gpu_indices) == ("b", (2, 3))


def test_topology_score_is_the_span_of_the_gpus_a_request_would_get():
    c = _split_pair_nodes()
    nodes = np.array([0, 1])
    cand = Candidates(node=nodes, gpu=np.full(2, -1), free_after=c.milli_free[nodes], cpu_after=c.cpu_free[nodes],
                      mem_after=c.mem_free[nodes])
    rng = np.random.default_rng(0)
    pair = TopologyScore().score(Context(c, PodRequest(gpu_count=2), cand, rng))
    assert pair.tolist() == pytest.approx([100 / 3, 200 / 3])  # a: same NUMA node; b: same PCIe switch
    assert TopologyScore().score(Context(c, PodRequest(gpu_count=1), cand, rng)).tolist() == [0, 0]
    assert TopologyScore().score(Context(c, PodRequest(gpu_milli=500), cand, rng)).tolist() == [0, 0]


def test_online_workload_learning(small_nodes):
    c = Cluster.from_descriptions(small_nodes)
    p = Placer()
    assert p.workload is None
    for _ in range(3):
        req = PodRequest(gpu_milli=250)
        p.observe(req)
        place_ok(p, c, req)
    assert p.workload is not None and len(p.workload) == 1
