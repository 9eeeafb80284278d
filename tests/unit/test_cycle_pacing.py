"""When a kicked scheduling cycle starts (``tide_placer.pacing.CyclePacing``, issue 17): at once for a trickle of
jobs, at least the gap after the last cycle's start while jobs come fast."""

from __future__ import annotations

from tide_placer.pacing import CyclePacing


def fast(pacing: CyclePacing, now: float, per_s: float, window_s: float = 0.25) -> None:
    """Jobs arriving at ``per_s`` over the window before ``now``."""
    n = int(per_s * window_s)
    for i in range(n):
        pacing.arrived(now - window_s + (i + 0.5) * window_s / n)


def test_a_trickle_of_jobs_is_placed_at_once() -> None:
    pacing = CyclePacing(gap_s=0.06, above_per_s=200)
    pacing.started(10.0)
    fast(pacing, 10.01, per_s=100)
    assert pacing.wait_s(10.01) == 0.0


def test_while_jobs_come_fast_cycles_start_the_gap_apart() -> None:
    pacing = CyclePacing(gap_s=0.06, above_per_s=200)
    pacing.started(10.0)
    fast(pacing, 10.01, per_s=400)
    assert abs(pacing.wait_s(10.01) - 0.05) < 1e-9
    assert pacing.wait_s(10.07) == 0.0  # the gap is over: at once
    pacing.started(10.07)
    fast(pacing, 10.08, per_s=400)
    assert abs(pacing.wait_s(10.08) - 0.05) < 1e-9


def test_fast_arrivals_that_stopped_hold_nothing() -> None:
    pacing = CyclePacing(gap_s=0.06, above_per_s=200)
    fast(pacing, 10.0, per_s=400)
    pacing.started(10.0)
    assert pacing.wait_s(10.3) == 0.0  # past the gap anyway
    pacing.started(10.3)
    assert pacing.wait_s(10.31) == 0.0  # the burst is out of the window: a lone kick goes at once


def test_the_first_cycle_and_a_gap_of_zero_never_wait() -> None:
    first = CyclePacing(gap_s=0.06, above_per_s=0)
    assert first.wait_s(5.0) == 0.0
    off = CyclePacing(gap_s=0.0, above_per_s=0)
    off.started(5.0)
    fast(off, 5.001, per_s=1000)
    assert off.wait_s(5.001) == 0.0


def test_a_threshold_of_zero_paces_every_cycle() -> None:
    pacing = CyclePacing(gap_s=0.5, above_per_s=0)
    pacing.started(1.0)
    assert abs(pacing.wait_s(1.2) - 0.3) < 1e-9
