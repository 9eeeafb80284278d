"""The share-waste term of the default policy's score (``tide.core.plugins.tide_frag``)."""

from __future__ import annotations

import pytest
from tide.core import Allocation, Cluster, Placer, PodRequest, TypicalPods
from tide.core import placer as placer_module
from tide.core.frag import FragModel
from tide.core.plugins.tide_frag import TideFragScore, share_waste_table

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
