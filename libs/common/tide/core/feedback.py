"""The feedback loop's decisions (pure, no I/O): OOM memory multipliers and topology affinity per job family.

The metrics service observes jobs (lifecycle events, telemetry) and calls these functions; it
persists what they return in Redis (``tide:placer:weights``) and publishes it on
``tide.placer.weights``; the placer applies it on its next decision (see ``docs/observability.md``).

Rules (every one bounded, every change carries the evidence that caused it):

- **OOM.** A job of family F fails with a GPU OOM: F's ``memory_multiplier`` is multiplied by
  ``oom_step`` (and raised at least to what the pod's measured peak needs, with headroom), capped at
  ``max_multiplier`` and at the device size (the multiplied request never exceeds the GPU's memory).
  ``clean_runs`` restarts at 0. The failed job is resubmitted once per failure under a deterministic
  id (``<job>-r<k>``, ``k <= max_resubmits``) with the GPU share's memory multiplied.
- **Decay.** Each job of F that succeeds is a clean run. From the ``decay_after``-th clean run on, the
  multiplier's excess over 1 shrinks by ``decay`` per clean run (1.5 -> 1.4 -> 1.32 ...), never below
  what the run's measured peak needed (with headroom), and snaps to 1 when within ``snap``.
- **Communication.** A job whose pods moved more than ``traffic_bytes_per_s`` across nodes (or
  across PCIe switches without NVLink) raises F's ``affinity`` by ``affinity_step`` (capped at
  ``max_affinity``); at ``AFFINITY_PREFER_NODE`` or above the placer treats F as
  ``topology.prefer: node``. A job of F that ran on one node with little far traffic does not lower
  it (that is the affinity working); a spread job with little far traffic lowers it by one step.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tide.schemas.feedback import AFFINITY_PREFER_NODE, APPLIED_MULTIPLIER_LABEL, FamilyWeights
from tide.schemas.job import JobSpec

MIB = 1024 * 1024
APPLIED_LABEL = APPLIED_MULTIPLIER_LABEL  # one definition: tide.schemas.feedback
"""Label on a resubmitted job: its share's memory already includes this multiplier."""
_RESUBMIT = re.compile(r"^(?P<root>.+)-r(?P<k>[0-9]+)$")
MAX_JOB_ID = 63


@dataclass(frozen=True)
class FeedbackPolicy:
    oom_step: float = 1.5
    max_multiplier: float = 8.0
    headroom: float = 1.1  # measured peak x headroom is the least a raise (or a decay) leaves
    decay_after: int = 2
    decay: float = 0.8
    snap: float = 0.02
    traffic_bytes_per_s: float = 1e9
    affinity_step: float = 1.0
    max_affinity: float = 3.0
    max_resubmits: int = 3


def _round(x: float) -> float:
    return round(x, 4)


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def multiplier_cap(request_mib: int | None, device_mib: int | None, policy: FeedbackPolicy) -> float:
    """The largest multiplier for a request: ``max_multiplier``, and the device size over the request."""
    cap = policy.max_multiplier
    if request_mib and device_mib:
        cap = min(cap, max(1.0, device_mib / request_mib))
    return cap


def after_oom(
    current: FamilyWeights | None,
    family: str,
    *,
    job_id: str,
    request_mib: int | None,
    device_mib: int | None,
    peak_bytes: int | None = None,
    policy: FeedbackPolicy = FeedbackPolicy(),
    now: float | None = None,
) -> FamilyWeights:
    """The family's weights after one of its jobs died of a GPU OOM."""
    w = current or FamilyWeights(family=family)
    old = w.memory_multiplier
    wanted = old * policy.oom_step
    why = f"x{policy.oom_step:g}"
    if peak_bytes and request_mib:
        by_peak = peak_bytes * policy.headroom / (request_mib * MIB)
        if by_peak > wanted:
            wanted, why = by_peak, f"peak {_gib(peak_bytes / MIB)} x{policy.headroom:g}"
    cap = multiplier_cap(request_mib, device_mib, policy)
    new = _round(max(old, min(wanted, cap)))
    parts = [f"job {job_id} OOM"]
    if request_mib:
        parts.append(f"request {_gib(request_mib)}")
    if peak_bytes:
        parts.append(f"peak {_gib(peak_bytes / MIB)}")
    if device_mib:
        parts.append(f"device {_gib(device_mib)}")
    capped = " (capped at the device size)" if wanted > cap and cap < policy.max_multiplier else (
        " (capped)" if wanted > cap else "")
    evidence = f"{', '.join(parts)}: memory multiplier {old:g} -> {new:g} ({why}){capped}"
    return w.model_copy(update={"memory_multiplier": new, "clean_runs": 0, "evidence": evidence,
                                "updated_at": time.time() if now is None else now})


def after_clean_run(
    current: FamilyWeights | None,
    *,
    job_id: str,
    request_mib: int | None = None,
    peak_bytes: int | None = None,
    policy: FeedbackPolicy = FeedbackPolicy(),
    now: float | None = None,
) -> FamilyWeights | None:
    """The family's weights after one of its jobs succeeded; None when the family has nothing to decay."""
    if current is None or current.memory_multiplier <= 1.0:
        return None
    runs = current.clean_runs + 1
    old = current.memory_multiplier
    new = old
    why = f"{runs} clean run(s) since the last OOM (last: job {job_id})"
    if runs >= policy.decay_after:
        new = 1.0 + (old - 1.0) * policy.decay
        floor = 1.0
        if peak_bytes and request_mib:
            floor = peak_bytes * policy.headroom / (request_mib * MIB)
        if new < floor:
            new = min(old, floor)
            why += f", kept above peak {_gib(peak_bytes / MIB)} x{policy.headroom:g}" if peak_bytes else ""
        if new - 1.0 < policy.snap:
            new = 1.0
        new = _round(new)
    evidence = (f"{why}: memory multiplier {old:g} -> {new:g}" if new != old
                else f"{why}: memory multiplier stays {old:g} (decays from clean run {policy.decay_after})")
    return current.model_copy(update={"memory_multiplier": new, "clean_runs": runs, "evidence": evidence,
                                      "updated_at": time.time() if now is None else now})


def after_traffic(
    current: FamilyWeights | None,
    family: str,
    *,
    job_id: str,
    far_bytes: float,
    seconds: float,
    nodes: int,
    policy: FeedbackPolicy = FeedbackPolicy(),
    now: float | None = None,
) -> FamilyWeights | None:
    """The family's weights after a job of it ran with ``far_bytes`` of cross-node/cross-switch traffic.

    None when nothing changes (not measured, or low traffic on one node)."""
    if seconds <= 0:
        return None
    rate = far_bytes / seconds
    w = current or FamilyWeights(family=family)
    old = w.affinity
    where = f"{nodes} nodes" if nodes > 1 else "one node"
    if rate >= policy.traffic_bytes_per_s:
        new = _round(min(policy.max_affinity, old + policy.affinity_step))
        if new == old:
            return None
        verdict = "high"
    elif nodes > 1 and old > 0:
        new = _round(max(0.0, old - policy.affinity_step))
        verdict = "low"
    else:
        return None
    prefer = " (prefers one node)" if new >= AFFINITY_PREFER_NODE else ""
    evidence = (f"job {job_id} on {where}: {far_bytes / 1e9:.2f} GB cross-node/cross-switch in {seconds:.1f}s = "
                f"{rate / 1e9:.2f} GB/s, {verdict} vs {policy.traffic_bytes_per_s / 1e9:g} GB/s: "
                f"affinity {old:g} -> {new:g}{prefer}")
    return w.model_copy(update={"affinity": new, "evidence": evidence,
                                "updated_at": time.time() if now is None else now})


# ------------------------------------------------------------------ resubmission
def share_memory_mib(spec: JobSpec) -> int | None:
    share = spec.spec.template.resources.gpu_share
    return share.memory_mib if share is not None else None


def applied_multiplier(spec: JobSpec) -> float:
    """The multiplier a resubmitted spec already carries (1 for a user's spec)."""
    try:
        return max(1.0, float(spec.metadata.labels.get(APPLIED_LABEL, "1")))
    except ValueError:
        return 1.0


def effective_share_mib(request_mib: int, multiplier: float, device_mib: int | None) -> int:
    """What the placer should reserve for a share request of ``request_mib`` under ``multiplier``."""
    mib = int(round(request_mib * max(1.0, multiplier)))
    return min(mib, device_mib) if device_mib else mib


def resubmit_id(job_id: str) -> tuple[str, int]:
    """The deterministic id of a failed job's resubmission and its number (``a`` -> ``a-r1`` -> ``a-r2``)."""
    m = _RESUBMIT.match(job_id)
    root, k = (m["root"], int(m["k"])) if m else (job_id, 0)
    suffix = f"-r{k + 1}"
    return root[: MAX_JOB_ID - len(suffix)].rstrip("-") + suffix, k + 1


def resubmission(
    job_id: str, spec: JobSpec, multiplier: float, device_mib: int | None, policy: FeedbackPolicy = FeedbackPolicy()
) -> tuple[str, dict[str, Any], str] | None:
    """(new job id, the spec to submit as JSON-able dict, why) for an OOM-failed job, or None with no point.

    Only GPU shares are resubmitted: a whole GPU or MIG instance cannot get more memory from a larger
    request. The new share is the user's request times ``multiplier`` (capped at the device size); the
    spec carries ``APPLIED_LABEL`` so the placer does not multiply it a second time.
    """
    base_mib = share_memory_mib(spec)
    if base_mib is None:
        return None
    original = int(round(base_mib / applied_multiplier(spec)))
    new_mib = effective_share_mib(original, multiplier, device_mib)
    new_id, k = resubmit_id(job_id)
    if new_mib <= base_mib or k > policy.max_resubmits:
        return None
    body = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    body["spec"]["template"]["resources"]["gpuShare"]["memoryMiB"] = new_mib
    body["metadata"]["labels"][APPLIED_LABEL] = f"{new_mib / original:.4g}"
    why = f"resubmitted {job_id} as {new_id} with a {_gib(new_mib)} share (was {_gib(base_mib)})"
    return new_id, body, why


# ------------------------------------------------------------------ communication
@dataclass(frozen=True)
class JobGpu:
    """One GPU of a job's pod, where it is (switch and NVLink group within its node, when known)."""

    pod: str
    node: str
    index: int = -1
    pcie_switch: int | None = None
    nvlink_group: int | None = None  # GPUs of one group reach each other by NVLink


@dataclass(frozen=True)
class PodBytes:
    pod: str
    pcie_bytes: float = 0.0
    network_bytes: int | None = None


def far(a: JobGpu, b: JobGpu) -> bool:
    """Traffic between two GPUs leaves the NVLink/PCIe-switch domain: other node, or another switch, no NVLink."""
    if a.node != b.node:
        return True
    if a.nvlink_group is not None and a.nvlink_group == b.nvlink_group:
        return False
    return a.pcie_switch is not None and b.pcie_switch is not None and a.pcie_switch != b.pcie_switch


def may_change_affinity(spec: JobSpec, policy: FeedbackPolicy = FeedbackPolicy()) -> bool:
    """Could ``after_traffic`` change anything after a job of ``spec`` ran? Only where its pods held more than one
    GPU in all (a pod without GPUs counts as one place): a lone pod on one GPU has no peer, so none of its
    traffic is far, and it ran on one node, which leaves every family's affinity as it is (unless the policy
    calls no traffic at all heavy). The feedback loop then reads and locks nothing for the job."""
    if policy.traffic_bytes_per_s <= 0:
        return True
    return spec.spec.replicas * max(1, spec.spec.template.resources.gpu) > 1


def far_traffic_bytes(gpus: Sequence[JobGpu], usage: Iterable[PodBytes]) -> float:
    """A job's bytes that crossed nodes (or PCIe switches without NVLink).

    Per pod: its own network-namespace bytes when measured (they leave the node), else its PCIe bytes
    times the fraction of the job's other GPUs that are far from its GPUs (traffic spread evenly over
    the peers; NVML has no per-peer counters). A job on one NVLink domain has none.
    """
    by_pod: dict[str, list[JobGpu]] = {}
    for g in gpus:
        by_pod.setdefault(g.pod, []).append(g)
    multi_node = len({g.node for g in gpus}) > 1
    total = 0.0
    for u in usage:
        mine = by_pod.get(u.pod, [])
        if not mine:
            continue
        if u.network_bytes is not None and multi_node:
            total += u.network_bytes
            continue
        fractions = []
        for g in mine:
            peers = [h for h in gpus if h is not g]
            if peers:
                fractions.append(sum(far(g, h) for h in peers) / len(peers))
        if fractions:
            total += u.pcie_bytes * sum(fractions) / len(fractions)
    return total
