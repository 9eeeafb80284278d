"""What each agent says it runs: the pods header of its last heartbeat, judged against the exits it reported since.

A heartbeat lists the pods its agent runs (``subjects.PODS_HEADER``) as of when the agent took the list
(``subjects.PODS_AT_HEADER``, the agent's clock). The placer stops any listed pod that is not its job's current
attempt (``PlacerService._fence_node``). But the placer reads heartbeats in batches, up to
``TIDE_TELEMETRY_READ_EVERY_S`` late, while pod exits come through JetStream at once: a pod whose exit is recorded
may still be listed by the last heartbeat read, which its agent sent before the pod ended. Such a pod is not judged
by that list: its agent said it ended after the list was taken (both times on the agent's clock). A pod the placer
declared ended itself (its node lost) is judged by every list: no agent reported its exit.
"""

from __future__ import annotations

import math

EXIT_MEMORY_S = 60.0
"""How long an agent's exit report is kept: a heartbeat listing the pod from before it ended is read within a
heartbeat period and a read batch of it."""


class ExitReports:
    """The pod exits agents reported, by node and pod (``<job>/<pod>.a<attempt>``, as heartbeats list them)."""

    def __init__(self, memory_s: float = EXIT_MEMORY_S) -> None:
        self.memory_s = memory_s
        self._at: dict[tuple[str, str], tuple[float, float]] = {}  # (node, pod) -> (exit time, when noted)

    def note(self, node_id: str, pod: str, exited_at: float, now: float) -> None:
        """The agent of ``node_id`` reported ``pod`` exited at ``exited_at`` (its clock); ``now``: monotonic."""
        self._at[(node_id, pod)] = (exited_at, now)
        if len(self._at) > 10_000:
            self._at = {k: v for k, v in self._at.items() if now - v[1] < self.memory_s}

    def still_listed(self, node_id: str, pods: frozenset[str], listed_at: float | None) -> frozenset[str]:
        """The pods of a list the agent took at ``listed_at`` (None: unknown, every pod counts) that it has not
        reported exited since."""
        if listed_at is None or not self._at:
            return pods
        at = self._at
        return frozenset(p for p in pods if (e := at.get((node_id, p))) is None or e[0] < listed_at)


def listed_at(header: str | None) -> float | None:
    """A heartbeat's ``PODS_AT_HEADER``: when its list was taken; None when absent (an older agent) or not a time."""
    if header is None:
        return None
    try:
        value = float(header)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
