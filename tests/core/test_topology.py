from __future__ import annotations

from tide.core import GpuPosition, Level, distance, pick_gpus, span


def pos(node="n", rack="r", spine="s", numa=0, pcie=0, nv=None):
    return GpuPosition(spine, rack, node, numa, pcie, nv)


def test_distance_levels():
    assert distance(pos(nv=0, pcie=0), pos(nv=0, pcie=1)) == Level.NVLINK
    assert distance(pos(pcie=1), pos(pcie=1)) == Level.PCIE_SWITCH
    assert distance(pos(pcie=0), pos(pcie=1)) == Level.NUMA
    assert distance(pos(numa=0, pcie=0), pos(numa=1, pcie=1)) == Level.NODE
    assert distance(pos(node="a"), pos(node="b")) == Level.RACK
    assert distance(pos(rack="a"), pos(rack="b")) == Level.SPINE
    assert distance(pos(spine="a"), pos(spine="b")) == Level.CLUSTER
    assert Level.parse("pcie-switch") == Level.PCIE_SWITCH


def test_span_and_pick():
    positions = [pos(pcie=i // 2, numa=i // 4) for i in range(8)]
    assert span([positions[0], positions[1]]) == Level.PCIE_SWITCH
    assert span(positions) == Level.NODE
    # GPUs 1,2,3,6,7 free: a pair should come from one PCIe switch, the smallest sufficient one
    assert pick_gpus([1, 2, 3, 6, 7], positions, 2) in {(2, 3), (6, 7)}
    assert pick_gpus([1, 2, 3, 6, 7], positions, 3) == (1, 2, 3)
