"""Wall-clock time for decisions that depend on the time of day (tides), injectable for tests.

``TIDE_CLOCK_FILE`` names a file holding an ISO-8601 local time (e.g. ``2026-12-02T23:00:00``);
when set, that is "now" for the placer's time-of-day decisions. Otherwise the system clock.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path


def wall_clock(clock_file: Path | None) -> datetime:
    if clock_file is not None:
        try:
            return datetime.fromisoformat(clock_file.read_text().strip())
        except (OSError, ValueError):
            pass
    return datetime.now()
