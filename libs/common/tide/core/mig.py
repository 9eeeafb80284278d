"""MIG profile tables and placement rules per GPU model (pure data, no I/O).

A MIG-capable GPU has 7 compute slices and 8 memory slots. A profile occupies
``size`` consecutive memory slots starting at one of its allowed ``starts`` and
``compute`` compute slices. Two instances on one GPU may not share a memory slot,
and the compute slices in use may not exceed 7. The tables follow NVIDIA's
MIG user guide (supported profiles and placements for A100/H100/H200).
"""

from __future__ import annotations

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


def _table(mem_unit_gb: float, names: dict[str, tuple[int, int, tuple[int, ...]]]) -> dict[str, MigProfile]:
    return {
        name: MigProfile(name, compute, int(size * mem_unit_gb * 1024), size, starts)
        for name, (compute, size, starts) in names.items()
    }


_SEVEN = (0, 1, 2, 3, 4, 5, 6)
_EVEN = (0, 2, 4, 6)

PROFILES_BY_MODEL: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _table(
        5,
        {
            "1g.5gb": (1, 1, _SEVEN),
            "1g.10gb": (1, 2, _EVEN),
            "2g.10gb": (2, 2, (0, 2, 4)),
            "3g.20gb": (3, 4, (0, 4)),
            "4g.20gb": (4, 4, (0,)),
            "7g.40gb": (7, 8, (0,)),
        },
    ),
    "A100-80GB": _table(
        10,
        {
            "1g.10gb": (1, 1, _SEVEN),
            "1g.20gb": (1, 2, _EVEN),
            "2g.20gb": (2, 2, (0, 2, 4)),
            "3g.40gb": (3, 4, (0, 4)),
            "4g.40gb": (4, 4, (0,)),
            "7g.80gb": (7, 8, (0,)),
        },
    ),
    "H100-80GB": _table(
        10,
        {
            "1g.10gb": (1, 1, _SEVEN),
            "1g.20gb": (1, 2, _EVEN),
            "2g.20gb": (2, 2, (0, 2, 4)),
            "3g.40gb": (3, 4, (0, 4)),
            "4g.40gb": (4, 4, (0,)),
            "7g.80gb": (7, 8, (0,)),
        },
    ),
    "H200-141GB": _table(
        17.625,
        {
            "1g.18gb": (1, 1, _SEVEN),
            "1g.35gb": (1, 2, _EVEN),
            "2g.35gb": (2, 2, (0, 2, 4)),
            "3g.71gb": (3, 4, (0, 4)),
            "4g.71gb": (4, 4, (0,)),
            "7g.141gb": (7, 8, (0,)),
        },
    ),
}

ALL_PROFILE_NAMES: frozenset[str] = frozenset(p for table in PROFILES_BY_MODEL.values() for p in table)


def profiles_for(model: str) -> dict[str, MigProfile]:
    """The MIG profiles of a GPU model; empty when the model is not MIG-capable."""
    return PROFILES_BY_MODEL.get(model, {})
