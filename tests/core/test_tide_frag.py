"""The share-waste term of the default policy's score (``tide.core.plugins.tide_frag``)."""

from __future__ import annotations

import numpy as np
import pytest
from tide.core import Allocation, Cluster, Placer, PodRequest, TypicalPods
from tide.core import placer as placer_module
from tide.core.frag import FragModel
from tide.core.plugins.tide_frag import TideFragScore, model_pressure, share_waste_table

from tests.core.conftest import gpu_node


def workload() -> TypicalPods:
    """openb-like: whole-GPU pods, common shares 810/470/650/320, and rare 160 shares."""
    reqs = ([PodRequest(cpu_milli=8000, gpu_count=1)] * 40 + [PodRequest(cpu_milli=3000, gpu_milli=810)] * 20
            + [PodRequest(cpu_milli=8000, gpu_milli=470)] * 14 + [PodRequest(cpu_milli=8000, gpu_milli=650)] * 5
            + [PodRequest(cpu_milli=4000, gpu_milli=320)] * 6 + [PodRequest(cpu_milli=2000, gpu_milli=160)])
    return TypicalPods.from_requests(reqs, coverage=1.0)


def test_share_waste_table_counts_on_common_shares_only():
    table = share_waste_table(FragModel(workload(), ["T4"]), coverage=0.9)
    assert table[1000] == 0 and table[0] == 0
    assert table[530] == 60  # one 470
    assert table[680] == 30  # one 650
    assert table[350] == 30  # one 320
    assert table[190] == 190  # 160 shares are too rare (2% of the shares) to count on
    assert table[210] == 210
    # with every size counted, the 160 fills the 190 slot
    assert share_waste_table(FragModel(workload(), ["T4"]), coverage=1.0)[190] == 30


@pytest.mark.parametrize("cache", [True, False])
def test_share_goes_where_it_completes_a_gpu_not_into_a_slot_kept_for_a_470(monkeypatch, cache):
    def run(**kw) -> Allocation:
        monkeypatch.setitem(placer_module.PLUGINS, "tide_frag", lambda: TideFragScore(**kw))
        c = Cluster.from_descriptions([gpu_node("n0", "T4", 4, cpu=96000, mem=393216)])
        c.allocate(Allocation("n0", cpu_milli=8000, gpu_indices=(0,), gpu_milli=(470,), gpu_mem_mib=(100,)))
        res = Placer("tide", workload=workload(), cache=cache).place(c, PodRequest(cpu_milli=4000, gpu_milli=320))
        assert isinstance(res, Allocation), res
        return res

    # FGD alone stacks the 320 on the 470's GPU (leaving 210, which no common share fills) ...
    assert run(pack_weight=0).gpu_indices == (0,)
    # ... the share-waste term opens a GPU (680 left, which a 650 completes) and keeps 530 for a 470
    assert run().gpu_indices != (0,)


@pytest.mark.parametrize("cache", [True, False])
def test_unrestricted_whole_pod_leaves_the_model_that_restricted_pods_need(monkeypatch, cache):
    """Few V100-only pods: FGD's signal for them is rounded away and node order would pick the V100."""
    reqs = [PodRequest(cpu_milli=8000, gpu_count=1)] * 40 + [
        PodRequest(cpu_milli=8000, gpu_count=1, gpu_models=("V100M32",))] * 2
    typical = TypicalPods.from_requests(reqs, coverage=1.0)

    def run(**kw) -> str:
        monkeypatch.setitem(placer_module.PLUGINS, "tide_frag", lambda: TideFragScore(**kw))
        c = Cluster.from_descriptions([gpu_node("v100", "V100M32", 4, cpu=96000, mem=393216)] + [
            gpu_node(f"t4-{i}", "T4", 4, cpu=96000, mem=393216) for i in range(3)])
        res = Placer("tide", workload=typical, cache=cache).place(c, PodRequest(cpu_milli=8000, gpu_count=1))
        assert isinstance(res, Allocation), res
        return res.node_id

    assert run(model_weight=0) == "v100"
    assert run() == "t4-0"
    # a V100-only pod still goes to the V100
    monkeypatch.setitem(placer_module.PLUGINS, "tide_frag", TideFragScore)
    c = Cluster.from_descriptions([gpu_node("v100", "V100M32", 4, cpu=96000, mem=393216),
                                   gpu_node("t4", "T4", 4, cpu=96000, mem=393216)])
    res = Placer("tide", workload=typical, cache=cache).place(
        c, PodRequest(cpu_milli=8000, gpu_count=1, gpu_models=("V100M32",)))
    assert isinstance(res, Allocation) and res.node_id == "v100"


def test_model_pressure_grows_as_a_restricted_models_gpus_are_taken():
    """Dynamic pressure: restricted demand to come (free milli x restricted share) over the model's room."""
    reqs = [PodRequest(cpu_milli=1000, gpu_count=1, gpu_models=m) for m in [()] * 8 + [("V100M32",), ("T4",)]]
    frag = FragModel(TypicalPods.from_requests(reqs, coverage=1.0), ["V100M32", "T4"])
    c = Cluster.from_descriptions([gpu_node("v100", "V100M32", 4, cpu=96000), gpu_node("t4", "T4", 4, cpu=96000)])
    static = model_pressure(frag, c.gpu_model, c.gpu_exists)
    assert static[1] == pytest.approx(0.1 / 0.5) and static[2] == pytest.approx(0.2)
    assert model_pressure(frag, c.gpu_model, c.gpu_exists, c.milli_free) == pytest.approx(static)
    c.allocate(Allocation("v100", cpu_milli=1000, gpu_indices=(0, 1, 2), gpu_milli=(1000,) * 3, gpu_mem_mib=(1,) * 3))
    dynamic = model_pressure(frag, c.gpu_model, c.gpu_exists, c.milli_free)
    # 5,000 milli free: 500 to come for each model; V100 has 1,000 free, T4 4,000
    assert dynamic[1] == pytest.approx(0.5) and dynamic[2] == pytest.approx(0.125)


@pytest.mark.parametrize("cache", [True, False])
def test_unrestricted_whole_pod_leaves_the_model_whose_gpus_are_running_out(monkeypatch, cache):
    """Equal restricted demand on V100 and T4 and equal capacity: the static pressure ties and node order
    picks the V100 even with 3 of its 4 GPUs taken; the dynamic pressure sees its room running out."""
    reqs = [PodRequest(cpu_milli=1000, gpu_count=1, gpu_models=m) for m in [()] * 8 + [("V100M32",), ("T4",)]]
    typical = TypicalPods.from_requests(reqs, coverage=1.0)

    def run(**kw) -> str:
        monkeypatch.setitem(placer_module.PLUGINS, "tide_frag", lambda: TideFragScore(**kw))
        c = Cluster.from_descriptions([gpu_node("v100", "V100M32", 4, cpu=96000, mem=393216),
                                       gpu_node("t4", "T4", 4, cpu=96000, mem=393216)])
        p = Placer("tide", workload=typical, cache=cache)
        for _ in range(3):  # V100-only pods take 3 of the 4 V100 GPUs
            res = p.place(c, PodRequest(cpu_milli=1000, gpu_count=1, gpu_models=("V100M32",)))
            assert isinstance(res, Allocation) and res.node_id == "v100"
            c.allocate(res)
        res = p.place(c, PodRequest(cpu_milli=1000, gpu_count=1))
        assert isinstance(res, Allocation), res
        return res.node_id

    assert run(model_dynamic=False) == "v100"
    assert run() == "t4"


def test_cached_and_uncached_agree_with_the_dynamic_model_pressure():
    """The pressure is cluster-wide state: the score cache keys its entries by it (``depends_on``)."""
    rng = np.random.default_rng(7)
    models = [(), ("V100M32",), ("T4",), ("V100M32", "A10")]
    nodes = [gpu_node(f"n{i}", ["T4", "V100M32", "A10", "G2"][i % 4], [2, 4, 8][i % 3], cpu=64000, mem=262144)
             for i in range(24)]

    def request() -> PodRequest:
        m = models[int(rng.integers(len(models)))]
        if rng.random() < 0.4:
            return PodRequest(cpu_milli=2000, gpu_milli=int(rng.choice([250, 500, 810])), gpu_models=m)
        return PodRequest(cpu_milli=int(rng.choice([1000, 8000])), gpu_count=int(rng.choice([1, 1, 2])), gpu_models=m)

    typical = TypicalPods.from_requests([request() for _ in range(300)])
    assert FragModel(typical, ["T4", "V100M32", "A10", "G2"]).restricted
    cached, plain = Placer("tide", workload=typical), Placer("tide", workload=typical, cache=False)
    c1, c2 = Cluster.from_descriptions(nodes), Cluster.from_descriptions(nodes)
    for _ in range(150):
        req = request()
        a, b = cached.place(c1, req), plain.place(c2, req)
        assert a == b
        if isinstance(a, Allocation):
            assert a.score == pytest.approx(b.score)
            c1.allocate(a)
            c2.allocate(b)


@pytest.mark.parametrize("cache", [True, False])
def test_fgd_term_keeps_its_scale_as_cpu_only_pods_grow(monkeypatch, cache):
    """Issue 17: CPU-only typical pods see every idle GPU as fragmented, so in FGD's average they add the
    same amount to every candidate and shrink what tells the nodes apart by their weight. A 1-GPU pod
    can go to node a (2 GPUs free: it leaves 1, too few for the 2-GPU pods) or b (3 free: it leaves 2).
    With CPU-only pods at 13% of the typical pods FGD's difference (87 milli-GPU) survives the 100-milli
    rounding; at 60% it is 40 milli, rounded away, and node order picks a. Measured against the GPU
    typical pods only (renormalised, ``fgd_gpu_only``) it is 100 milli whatever the CPU-only share."""
    def run(cpu_only: int, **kw) -> str:
        reqs = ([PodRequest(cpu_milli=4000, gpu_count=1)] * 36 + [PodRequest(cpu_milli=4000, gpu_count=2)] * 4
                + [PodRequest(cpu_milli=4000)] * cpu_only)
        typical = TypicalPods.from_requests(reqs, coverage=1.0)
        monkeypatch.setitem(placer_module.PLUGINS, "tide_frag", lambda: TideFragScore(**kw))
        c = Cluster.from_descriptions([gpu_node(n, "T4", 4, cpu=96000, mem=393216) for n in ("a", "b")])
        c.allocate(Allocation("a", cpu_milli=8000, gpu_indices=(0, 1), gpu_milli=(1000,) * 2, gpu_mem_mib=(1,) * 2))
        c.allocate(Allocation("b", cpu_milli=4000, gpu_indices=(0,), gpu_milli=(1000,), gpu_mem_mib=(1,)))
        res = Placer("tide", workload=typical, cache=cache).place(c, PodRequest(cpu_milli=4000, gpu_count=1))
        assert isinstance(res, Allocation), res
        return res.node_id

    assert run(6, fgd_gpu_only=False) == "b"
    assert run(60, fgd_gpu_only=False) == "a"  # the old score: FGD's signal rounded away
    assert run(6) == "b"
    assert run(60) == "b"
