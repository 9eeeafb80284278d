"""Tidal windows (pure): open, returning early enough, closed; windows across midnight."""

from __future__ import annotations

from datetime import datetime

import pytest
from tide.core.tides import TideState, parse_tides

RULE = parse_tides({"tides": [{"lend": "inference", "to": "training", "start": "22:00", "end": "07:00",
                               "returnBeforeSeconds": 900}]})[0]


@pytest.mark.parametrize(("clock", "state"), [
    ("2026-12-02T21:59:59", TideState.CLOSED),
    ("2026-12-02T22:00:00", TideState.OPEN),
    ("2026-12-03T02:00:00", TideState.OPEN),
    ("2026-12-03T06:44:59", TideState.OPEN),
    ("2026-12-03T06:45:00", TideState.RETURNING),
    ("2026-12-03T06:59:59", TideState.RETURNING),
    ("2026-12-03T07:00:00", TideState.CLOSED),
    ("2026-12-03T12:00:00", TideState.CLOSED),
])
def test_window_across_midnight(clock: str, state: TideState) -> None:
    assert RULE.state(datetime.fromisoformat(clock)) == state


def test_daytime_window_and_bad_rules() -> None:
    day = parse_tides({"tides": [{"lend": "a", "to": "b", "start": "09:00", "end": "17:00"}]})[0]
    assert day.state(datetime.fromisoformat("2026-12-02T12:00")) == TideState.OPEN
    assert day.state(datetime.fromisoformat("2026-12-02T16:55")) == TideState.RETURNING
    assert day.state(datetime.fromisoformat("2026-12-02T18:00")) == TideState.CLOSED
    with pytest.raises(ValueError, match="is not HH:MM"):
        parse_tides({"tides": [{"lend": "a", "to": "b", "start": "late", "end": "17:00"}]})
    with pytest.raises(ValueError, match="to itself"):
        parse_tides({"tides": [{"lend": "a", "to": "a", "start": "09:00", "end": "17:00"}]})
