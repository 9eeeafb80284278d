"""Topology tree of a cluster and a communication distance between two GPU positions.

Levels, nearest first: NVLink/NVSwitch domain < PCIe switch < NUMA node < node < rack < spine.
Two positions are as close as the deepest level they share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class Level(IntEnum):
    NVLINK = 0
    PCIE_SWITCH = 1
    NUMA = 2
    NODE = 3
    RACK = 4
    SPINE = 5
    CLUSTER = 6  # different spines

    @classmethod
    def parse(cls, name: str) -> Level:
        return cls[name.upper().replace("-", "_")]


@dataclass(frozen=True, slots=True)
class GpuPosition:
    spine: str
    rack: str
    node: str
    numa_node: int = 0
    pcie_switch: int = 0
    nvlink_domain: int | None = None


def distance(a: GpuPosition, b: GpuPosition) -> Level:
    """The tree level two GPU (or node) positions share; lower is closer."""
    if a.spine != b.spine:
        return Level.CLUSTER
    if a.rack != b.rack:
        return Level.SPINE
    if a.node != b.node:
        return Level.RACK
    if a.nvlink_domain is not None and a.nvlink_domain == b.nvlink_domain:
        return Level.NVLINK
    if a.pcie_switch == b.pcie_switch:
        return Level.PCIE_SWITCH
    if a.numa_node == b.numa_node:
        return Level.NUMA
    return Level.NODE


def span(positions: Sequence[GpuPosition]) -> Level:
    """The worst pairwise distance in a set of positions (NVLINK for 0 or 1 positions)."""
    worst = Level.NVLINK
    for i in range(len(positions)):
        for j in range(i + 1, len(positions)):
            worst = max(worst, distance(positions[i], positions[j]))
    return worst


def pick_gpus(candidates: Sequence[int], positions: Sequence[GpuPosition], n: int) -> tuple[int, ...]:
    """Choose ``n`` of ``candidates`` (GPU indices) as close together as possible.

    Walk down the tree (NVLink domain, NUMA node, PCIe switch): at each level keep the smallest group
    that still holds ``n`` GPUs (best fit keeps big groups whole for later large requests), then take
    the lowest indices of what is left.
    """
    pool = sorted(candidates)
    if n >= len(pool):
        return tuple(pool[:n])
    for key in ("nvlink_domain", "numa_node", "pcie_switch"):
        groups: dict[int, list[int]] = {}
        for g in pool:
            value = getattr(positions[g], key)
            if value is not None:
                groups.setdefault(value, []).append(g)
        fitting = [grp for grp in groups.values() if len(grp) >= n]
        if fitting:
            pool = min(fitting, key=lambda grp: (len(grp), grp[0]))
    return tuple(pool[:n])
