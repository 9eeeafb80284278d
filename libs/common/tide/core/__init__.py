"""Tide's pure placement core: cluster model, requests, scoring plugins and the placer (no I/O)."""

from tide.core.cluster import Cluster
from tide.core.filtering import never_fits as _never_fits
from tide.core.frag import FragModel, PodShape, TypicalPods
from tide.core.mig import ALL_PROFILE_NAMES, PROFILES_BY_MODEL, MigProfile, profiles_for
from tide.core.model import MILLI, Allocation, MigAssignment, OversubscriptionError, PodRequest, Unfit
from tide.core.placer import DEFAULT_POLICY, PLUGINS, POLICIES, Placer, PolicySpec
from tide.core.topology import GpuPosition, Level, distance, pick_gpus, span


def never_fits(cluster: Cluster, request: PodRequest) -> str | None:
    """Why ``request`` cannot fit even on the empty cluster, or None when it could."""
    return _never_fits(cluster, request)


__all__ = [
    "ALL_PROFILE_NAMES",
    "DEFAULT_POLICY",
    "MILLI",
    "PLUGINS",
    "POLICIES",
    "PROFILES_BY_MODEL",
    "Allocation",
    "Cluster",
    "FragModel",
    "GpuPosition",
    "Level",
    "MigAssignment",
    "MigProfile",
    "OversubscriptionError",
    "Placer",
    "PodRequest",
    "PodShape",
    "PolicySpec",
    "TypicalPods",
    "Unfit",
    "distance",
    "never_fits",
    "pick_gpus",
    "profiles_for",
    "span",
]
