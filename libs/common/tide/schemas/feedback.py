"""The feedback loop's output: per job family adjustments the placer applies (contract between services).

Published on ``tide.placer.weights`` and persisted in Redis hash ``tide:placer:weights``
(field = family, value = ``FamilyWeights`` JSON). The metrics service writes them; the placer reads
them before each placement decision.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

from pydantic import BaseModel, Field

from tide.schemas.events import Message
from tide.schemas.job import JobSpec

AFFINITY_PREFER_NODE = 1.0  # a family's affinity at or above this: place its pods on one node where one fits
APPLIED_MULTIPLIER_LABEL = "tide.feedback/memory-multiplier"  # on resubmitted jobs: multiplier already in the spec


class FamilyWeights(BaseModel):
    family: str
    memory_multiplier: float = Field(default=1.0, ge=1.0, description="applied to the GPU memory request")
    affinity: float = Field(default=0.0, ge=0.0, description="topology affinity; >= 1 prefers one node")
    clean_runs: int = Field(default=0, ge=0, description="runs without OOM since the last raise")
    evidence: str = Field(default="", description="what caused the last change")
    updated_at: float = Field(default_factory=time.time)


class WeightsChanged(Message):
    """On ``tide.placer.weights``: one family's new weights and why."""

    weights: FamilyWeights


def weights_for(weights: Mapping[str, FamilyWeights], spec: JobSpec) -> FamilyWeights | None:
    """The feedback weights of the job's family, if the loop set any (its family worked out only then: the
    digest of the command costs more than the lookup, and most clusters have no weights for most families)."""
    return weights.get(family_of(spec)) if weights else None


def family_of(spec: JobSpec) -> str:
    """A job's family: its ``family`` label, else a digest of its command."""
    label = spec.metadata.labels.get("family")
    if label:
        return label
    digest = hashlib.sha256("\0".join(spec.spec.template.command).encode()).hexdigest()[:12]
    return f"cmd-{digest}"
