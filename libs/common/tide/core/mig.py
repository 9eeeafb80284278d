"""MIG profile tables and placement rules per GPU model (pure data, no I/O).

A MIG-capable GPU has 7 compute slices and 8 memory slots. A profile occupies
``size`` consecutive memory slots starting at one of its allowed ``starts`` and
``compute`` compute slices. Two instances on one GPU may not share a memory slot,
and the compute slices in use may not exceed 7. The tables follow NVIDIA's
MIG user guide (supported profiles and placements for A100/H100/H200).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIG_MEMORY_SLOTS = 8
MIG_COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    compute: int
    memory_mib: int
    size: int
    starts: tuple[int, ...]


# (compute slices, memory slots, allowed first slots): the same placement rules on every 7-slice GPU
_SHAPES: tuple[tuple[int, int, tuple[int, ...]], ...] = (
    (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (1, 2, (0, 2, 4, 6)),
    (2, 2, (0, 2, 4)),
    (3, 4, (0, 4)),
    (4, 4, (0,)),
    (7, 8, (0,)),
)


def _table(slot_gb: float) -> dict[str, MigProfile]:
    """A model's profiles from the size of one memory slot; names as NVIDIA's (``<compute>g.<GB>gb``)."""
    table = {}
    for compute, size, starts in _SHAPES:
        name = f"{compute}g.{math.floor(size * slot_gb + 0.5)}gb"
        table[name] = MigProfile(name, compute, int(size * slot_gb * 1024), size, starts)
    return table


PROFILES_BY_MODEL: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _table(5),
    "A100-80GB": _table(10),
    "H100-80GB": _table(10),
    "H200-141GB": _table(17.625),
}

ALL_PROFILE_NAMES: frozenset[str] = frozenset(p for table in PROFILES_BY_MODEL.values() for p in table)


def profiles_for(model: str) -> dict[str, MigProfile]:
    """The MIG profiles of a GPU model; empty when the model is not MIG-capable."""
    return PROFILES_BY_MODEL.get(model, {})
