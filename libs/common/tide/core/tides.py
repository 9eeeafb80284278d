"""Tidal lending (pure): idle nodes of one pool are lent to another pool's jobs in a daily window.

A rule ``{lend: inference, to: training, start: "22:00", end: "07:00", returnBeforeSeconds: 600}``
makes idle nodes labelled ``pool=inference`` usable by jobs selecting ``pool=training`` while the
window is *open*; from ``end - returnBeforeSeconds`` on it is *returning*: the borrowed work is
preempted gracefully, so the nodes are back, empty, when the window ends. Choose
``returnBeforeSeconds`` at least the borrowers' grace period plus a scheduling round. With
``keepGPUs: N`` the lending pool keeps N whole GPUs of headroom while the window is open: its own jobs
arriving inside the window start there at once instead of waiting out a borrower's grace period.
Idle nodes are held back (smallest first) until N whole GPUs are free outside the lent nodes, and
when the pool's own jobs use up the headroom, borrowers are preempted on the fewest lent nodes that
restore it (``tide.core.cycle.lending``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from enum import StrEnum
from typing import Any, cast


class TideState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    RETURNING = "returning"


@dataclass(frozen=True)
class TideRule:
    lend: str
    to: str
    start: time
    end: time
    return_before_s: float = 600.0
    keep_gpus: int = 0  # whole GPUs of headroom the lending pool keeps in an open window

    def state(self, now: datetime) -> TideState:
        """Where ``now`` (local wall time) falls in the daily window; windows may cross midnight."""
        day = timedelta(days=1)
        for base in (now.date() - day, now.date()):
            opens = datetime.combine(base, self.start, tzinfo=now.tzinfo)
            closes = datetime.combine(base, self.end, tzinfo=now.tzinfo)
            if closes <= opens:
                closes += day
            if opens <= now < closes:
                returning = closes - timedelta(seconds=self.return_before_s)
                return TideState.RETURNING if now >= returning else TideState.OPEN
        return TideState.CLOSED


def _clock(value: str, field: str) -> time:
    try:
        return time.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"tide {field} {value!r} is not HH:MM") from exc


def parse_tides(config: Mapping[str, object] | None) -> list[TideRule]:
    rules = []
    for item in cast("Iterable[Mapping[str, Any]]", (config or {}).get("tides") or []):
        rule = TideRule(
            lend=str(item["lend"]),
            to=str(item["to"]),
            start=_clock(str(item["start"]), "start"),
            end=_clock(str(item["end"]), "end"),
            return_before_s=float(item.get("returnBeforeSeconds", 600)),
            keep_gpus=int(item.get("keepGPUs", 0)),
        )
        if rule.keep_gpus < 0:
            raise ValueError(f"tide keepGPUs {rule.keep_gpus} is negative")
        if rule.lend == rule.to:
            raise ValueError(f"tide lends pool {rule.lend!r} to itself")
        rules.append(rule)
    return rules
