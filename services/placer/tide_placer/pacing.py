"""When the placer's next scheduling cycle may start: at once, or, while jobs come fast, a gap after the last one.

Each cycle has a cost of its own whatever it places: the reconcile round trip, the view's refresh, the plan's
set-up, and a start request per node, an event batch and a record write for what it binds. At 400 jobs a second
the ``queued`` events kick a cycle every few milliseconds, each for a handful of jobs; cycles started at least
``gap_s`` apart take more jobs each (more of them per node's start request, per event batch and per Redis call),
for less CPU per job, and each job waits at most ``gap_s`` more (docs/benchmarks.md, issue 17 thirteenth round).
A trickle of jobs is not held: below ``above_per_s`` submissions a second a kick starts a cycle at once, as the
queue's intake lingers only while submissions come fast.
"""

from __future__ import annotations

from tide.bus.nats import ARRIVAL_WINDOW_S, ArrivalRate


class CyclePacing:
    """Counts the kicks that say jobs arrived and says how long a kicked cycle waits before it starts."""

    def __init__(self, gap_s: float, above_per_s: float, window_s: float = ARRIVAL_WINDOW_S) -> None:
        self.gap_s = gap_s
        self.above_per_s = above_per_s
        self._arrivals = ArrivalRate(window_s)
        self._last_start: float | None = None

    def arrived(self, now: float) -> None:
        """A job arrived (its ``queued`` event, or a kick from the queue)."""
        self._arrivals.note(now)

    def wait_s(self, now: float) -> float:
        """How long a cycle kicked at ``now`` waits: 0 with no gap, while jobs come slower than ``above_per_s``
        a second, or once ``gap_s`` has passed since the last cycle started."""
        if self.gap_s <= 0 or self._last_start is None or self._arrivals.per_s(now) < self.above_per_s:
            return 0.0
        return max(0.0, self._last_start + self.gap_s - now)

    def started(self, now: float) -> None:
        """A cycle starts at ``now``."""
        self._last_start = now
