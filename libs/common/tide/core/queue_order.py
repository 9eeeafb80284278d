"""Admission order (pure): priority first, then age."""

from __future__ import annotations

from tide.schemas.job import PRIORITY_VALUES, PriorityClass

_SPAN = 1e11  # seconds; larger than any epoch timestamp we will see


def pending_score(priority_class: PriorityClass, submitted_at: float) -> float:
    """Lower scores are admitted first: higher priority, then earlier submission."""
    return (max(PRIORITY_VALUES.values()) - PRIORITY_VALUES[priority_class]) * _SPAN + submitted_at
