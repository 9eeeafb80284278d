"""Every Redis key Tide uses, defined once. All keys live under ``tide:``."""

from __future__ import annotations

PREFIX = "tide"

JOBS_INDEX = f"{PREFIX}:jobs"  # zset job_id -> submitted_at
PENDING = f"{PREFIX}:pending"  # zset job_id -> admission order score
CANCELLING = f"{PREFIX}:cancelling"  # set of job ids whose pods must be stopped
NODES = f"{PREFIX}:nodes"  # set of node ids
NODES_VERSION = f"{PREFIX}:nodes:version"  # counter bumped on every (re-)registration
LOST_NODES = f"{PREFIX}:nodes:lost"  # set of node ids whose heartbeats stopped (until they are back and fenced)
NODE_LEASES = f"{PREFIX}:nodes:lease"  # hash node id -> JSON {lease_s, fence_grace_s, heartbeat_s} it registered
CLAIMS_INDEX = f"{PREFIX}:claims"  # set of claim keys currently held
RESERVATIONS = f"{PREFIX}:reservations"  # zset reservation id -> expiry (ms, Redis clock)
RESERVATION_PREFIX = f"{PREFIX}:resv:"  # + id: hash claims (JSON list of claim keys), expires_ms
EXPIRED_RESERVATIONS = f"{PREFIX}:resv-expired"  # list of lapsed reservation ids for the reconciler
QUEUE_CONFIG = f"{PREFIX}:queues:config"  # JSON queue tree (tide.core.queues), written by the queue service
WEIGHTS = f"{PREFIX}:placer:weights"  # hash family -> FamilyWeights JSON (the feedback loop's output)


def job(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def node(node_id: str) -> str:
    """JSON inventory (NodeDescription) and liveness of a node."""
    return f"{PREFIX}:node:{node_id}"


def capacity(node_id: str) -> str:
    """Hash resource-field -> capacity, written on registration."""
    return f"{PREFIX}:cap:{node_id}"


def used(node_id: str) -> str:
    """Hash resource-field -> amount claimed; only the claim scripts write it."""
    return f"{PREFIX}:used:{node_id}"


def claim(job_id: str, pod: str) -> str:
    """Hash: ``items`` (JSON list of [node, field, amount]) and ``alloc`` (JSON allocation)."""
    return f"{PREFIX}:claim:{job_id}:{pod}"


def rejected(job_id: str) -> str:
    """Rejection reason of a submission that never became a job (expires after a day)."""
    return f"{PREFIX}:rejected:{job_id}"
