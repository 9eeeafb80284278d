"""The per-node score cache: cached and uncached placers make the same decisions, re-scoring only changed nodes."""

from __future__ import annotations

import numpy as np
import pytest
from tide.core import Allocation, Cluster, Placer, PodRequest, TypicalPods, Unfit
from tide.schemas.node import default_h100_node

from .conftest import gpu_node

NODES = [
    gpu_node("t4-a", "T4", 2, cpu=16000, mem=32768),
    gpu_node("t4-b", "T4", 4, cpu=32000, mem=65536, labels={"pool": "inference"}),
    gpu_node("v100-a", "V100M32", 8, cpu=96000, mem=393216, gpu_mem=32510),
    gpu_node("v100-b", "V100M32", 8, cpu=64000, mem=262144, gpu_mem=32510),
    gpu_node("a100", "A100-40GB", 2, cpu=32000, mem=65536, gpu_mem=40960, mig=True),
    default_h100_node("h100"),
    gpu_node("t4-c", "T4", 4, cpu=24000, mem=65536),
    gpu_node("v100-c", "V100M32", 4, cpu=48000, mem=131072, gpu_mem=32510),
]
POLICIES = ["tide", "fgd", "bestfit", "worstfit", "gpupacking", "dotproduct", "topology"]


def random_request(rng: np.random.Generator) -> PodRequest:
    kind = rng.integers(10)
    cpu = int(rng.choice([0, 1000, 2000, 4000, 8000, 16000]))
    mem = int(rng.choice([0, 1024, 16384, 100000]))
    if kind < 4:
        return PodRequest(cpu_milli=cpu, memory_mib=mem, gpu_milli=int(rng.choice([100, 250, 500, 700])),
                          gpu_mem_mib=int(rng.choice([0, 4096, 12000, 30000])))
    if kind < 8:
        models = ("V100M32",) if kind == 7 else ()
        return PodRequest(cpu_milli=cpu, memory_mib=mem, gpu_count=int(rng.choice([1, 1, 2, 4])), gpu_models=models)
    if kind == 8:
        return PodRequest(cpu_milli=cpu, memory_mib=mem, node_selector={"pool": "inference"}, gpu_count=1)
    return PodRequest(cpu_milli=cpu, memory_mib=mem)


def same(a: Allocation | Unfit, b: Allocation | Unfit) -> bool:
    if isinstance(a, Unfit) or isinstance(b, Unfit):
        return isinstance(a, Unfit) and isinstance(b, Unfit) and a == b
    return a == b and a.score == pytest.approx(b.score)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cached_and_uncached_placers_agree(policy, seed):
    check_agreement(policy, seed, "first")


@pytest.mark.parametrize("policy", ["tide", "bestfit"])
def test_cached_and_uncached_placers_agree_with_random_ties(policy):
    check_agreement(policy, 4, "random")


TYPES = [("T4", 2, 16000, 15000), ("T4", 4, 32000, 15000), ("V100M32", 8, 96000, 32510), ("V100M32", 4, 48000, 32510)]
BIG = [gpu_node(f"n{i:03d}", TYPES[i % 4][0], TYPES[i % 4][1], cpu=TYPES[i % 4][2], mem=262144,
                gpu_mem=TYPES[i % 4][3], labels={"pool": "inference" if i % 7 == 0 else "training"})
       for i in range(300)]


@pytest.mark.parametrize("policy", ["tide", "gpupacking", "topology"])
def test_cached_and_uncached_placers_agree_on_a_large_cluster(policy):
    """300 nodes: the cold cache scores one node per kind of untouched node and copies the scores."""
    check_agreement(policy, 5, "first", BIG, 120)


def check_agreement(policy: str, seed: int, tie_break: str, nodes: list | None = None, steps: int = 300) -> None:
    rng = np.random.default_rng(seed)
    wl = TypicalPods.from_requests([random_request(rng) for _ in range(200)])
    cached = Placer(policy, workload=wl, cache=True, seed=seed, tie_break=tie_break)
    plain = Placer(policy, workload=wl, cache=False, seed=seed, tie_break=tie_break)
    cluster = Cluster.from_descriptions(nodes or NODES)
    held: list[Allocation] = []
    for step in range(steps):
        if held and rng.random() < 0.35:
            cluster.release(held.pop(int(rng.integers(len(held)))))
            continue
        req = random_request(rng)
        if step % 25 == 0:
            # a what-if copy diverges from the cluster, then decisions go back to the cluster itself
            what_if = cluster.copy()
            for _ in range(3):
                r = random_request(rng)
                a, b = cached.place(what_if, r), plain.place(what_if, r)
                assert same(a, b), (r, a, b)
                if isinstance(a, Allocation):
                    what_if.allocate(a)
        a, b = cached.place(cluster, req), plain.place(cluster, req)
        assert same(a, b), (step, req, a, b)
        if isinstance(a, Allocation):
            cluster.allocate(a)
            held.append(a)


def test_a_rebuilt_cluster_keeps_the_rows_that_did_not_change():
    wl = TypicalPods.from_requests([PodRequest(cpu_milli=1000, gpu_count=1), PodRequest(cpu_milli=500, gpu_milli=500)])
    cached, plain = Placer("tide", workload=wl), Placer("tide", workload=wl, cache=False)
    cluster = Cluster.from_descriptions(NODES)
    claims = []
    req = PodRequest(cpu_milli=1000, gpu_milli=500)
    for _ in range(5):
        a = cached.place(cluster, req)
        assert isinstance(a, Allocation)
        cluster.allocate(a)
        claims.append(a)
    before = cached._score_cache.rescored  # type: ignore[union-attr]
    # the live placer rebuilds the cluster from descriptions and claims every cycle
    rebuilt = Cluster.from_descriptions(NODES)
    for a in claims:
        rebuilt.allocate(a)
    assert same(cached.place(rebuilt, req), plain.place(rebuilt, req))
    # only the nodes holding claims (their stamps are new) were re-scored
    touched = len({a.node_id for a in claims})
    assert cached._score_cache.rescored - before <= touched  # type: ignore[union-attr]
    # a cluster with other nodes resets the cache and still decides right
    other = Cluster.from_descriptions(NODES[:3])
    assert same(cached.place(other, req), plain.place(other, req))


def test_only_changed_nodes_are_rescored():
    wl = TypicalPods.from_requests([PodRequest(cpu_milli=1000, gpu_count=1)])
    p = Placer("tide", workload=wl)
    cluster = Cluster.from_descriptions(NODES)
    req = PodRequest(cpu_milli=1000, gpu_count=1, memory_mib=1024)
    cluster.allocate(p.place(cluster, req))  # type: ignore[arg-type]
    first = p._score_cache.rescored  # type: ignore[union-attr]
    assert first == len(NODES)
    # same shape, other memory: the same entry; only the node just used is re-scored
    cluster.allocate(p.place(cluster, PodRequest(cpu_milli=1000, gpu_count=1, memory_mib=2048)))  # type: ignore[arg-type]
    assert p._score_cache.rescored == first + 1  # type: ignore[union-attr]
    # new weights or a new workload clear the cache
    p.set_weights({"bestfit_fine": 0.01})
    p.place(cluster, req)
    assert p._score_cache.rescored == first + 1 + len(NODES)  # type: ignore[union-attr]


def test_mig_and_random_policies_bypass_the_cache():
    cluster = Cluster.from_descriptions(NODES)
    p = Placer("random", seed=3)
    assert isinstance(p.place(cluster, PodRequest(gpu_count=1)), Allocation)
    assert p._score_cache.rescored == 0  # type: ignore[union-attr]
    t = Placer("tide")
    a = t.place(cluster, PodRequest(mig_profile="1g.5gb"))
    assert isinstance(a, Allocation) and a.mig is not None
    assert t._score_cache.rescored == 0  # type: ignore[union-attr]


def test_unfit_reasons_come_from_the_uncached_path():
    cluster = Cluster.from_descriptions(NODES)
    p = Placer("tide")
    res = p.place(cluster, PodRequest(gpu_count=1, memory_mib=10**7))
    assert isinstance(res, Unfit) and not res.resolvable
    big = PodRequest(cpu_milli=20000, gpu_count=8)
    for _ in range(10):
        res = p.place(cluster, big)
        if isinstance(res, Unfit):
            break
        cluster.allocate(res)
    assert isinstance(res, Unfit) and res.resolvable and "nodes fit" in res.reason
    assert res == Placer("tide", cache=False).place(cluster, big)


def test_the_learnt_workload_is_kept_while_it_does_not_move():
    """The live placer learns the typical pods online; a refresh that changes nothing keeps the cache."""
    p = Placer("tide")
    cluster = Cluster.from_descriptions(NODES)
    shapes = [PodRequest(cpu_milli=1000, gpu_count=1), PodRequest(cpu_milli=500, gpu_milli=500)]
    for k in range(501):  # the first pod starts a model, the 501st refreshes it from the window
        p.observe(shapes[k % 2])
    first = p.workload
    assert first is not None and len(first) == 2
    p.place(cluster, shapes[0])
    rescored = p._score_cache.rescored  # type: ignore[union-attr]
    for k in range(1000):  # two refreshes, same mix
        p.observe(shapes[k % 2])
    assert p.workload is first
    p.place(cluster, shapes[0])
    assert p._score_cache.rescored == rescored  # type: ignore[union-attr]
    for _ in range(1000):  # the mix changes: a new model, the cache starts again
        p.observe(shapes[0])
    assert p.workload is not first
    p.place(cluster, shapes[0])
    assert p._score_cache.rescored > rescored  # type: ignore[union-attr]
