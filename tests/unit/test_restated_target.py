"""Issue 17's restated allocation target, as bench/packing_bound.py reports it per trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
pytest.importorskip("scipy")
from packing_bound import restated_target  # noqa: E402


def test_the_three_quarters_target_stands_where_the_bound_allows_it() -> None:
    # FGD 95.25 -> unallocated 4.75, three quarters of it 3.5625 -> 96.4375, under the bound 96.92
    assert restated_target(96.4375, 96.92) == pytest.approx(96.438, abs=1e-3)


def test_a_target_at_the_bound_is_still_allowed() -> None:
    assert restated_target(96.9, 96.9) == pytest.approx(96.9)


def test_where_the_bound_makes_three_quarters_impossible_the_target_is_half_a_point_under_it() -> None:
    # gpushare60: FGD 91.2 -> 93.4, above the bound 93.34
    assert restated_target(93.4, 93.34) == pytest.approx(92.84)
