"""Every Redis key Tide uses: the one codec that builds and parses them.

Every key starts with ``{tide}:``. The braces are a Redis Cluster hash tag: only ``tide`` is hashed, so all
of Tide's keys fall into one slot and every multi-key Lua script runs on Redis Cluster as it does on a single
server. This is compatibility, not sharding: the one slot lives on one shard (docs/architecture.md).
Job ids (``JOB_ID_PATTERN``) and node ids never contain ``:``, so the parts of a key split unambiguously.
"""

from __future__ import annotations

PREFIX = "{tide}"
"""Key prefix and Redis Cluster hash tag. ACL users are limited to ``ACL_PATTERN``."""
ACL_PATTERN = f"{PREFIX}:*"

JOBS_INDEX = f"{PREFIX}:jobs"  # zset job_id -> submitted_at
PENDING = f"{PREFIX}:pending"  # zset job_id -> admission order score
CANCELLING = f"{PREFIX}:cancelling"  # set of job ids whose pods must be stopped
NODES = f"{PREFIX}:nodes"  # set of node ids
NODES_VERSION = f"{PREFIX}:nodes:version"  # counter bumped on every (re-)registration
LOST_NODES = f"{PREFIX}:nodes:lost"  # set of node ids whose heartbeats stopped (until they are back and fenced)
NODE_LEASES = f"{PREFIX}:nodes:lease"  # hash node id -> JSON {lease_s, fence_grace_s, heartbeat_s} it registered
CLAIMS_INDEX = f"{PREFIX}:claims"  # set of claim keys currently held
RESERVATIONS = f"{PREFIX}:reservations"  # zset reservation id -> expiry (ms, Redis clock)
EXPIRED_RESERVATIONS = f"{PREFIX}:resv-expired"  # list of lapsed reservation ids for the reconciler
QUEUE_CONFIG = f"{PREFIX}:queues:config"  # JSON queue tree (tide.core.queues), written by the queue service
WEIGHTS = f"{PREFIX}:placer:weights"  # hash family -> FamilyWeights JSON (the feedback loop's output)
PLACER_LEADER = f"{PREFIX}:placer:leader"  # string, TTL: the active placer's lease token (``tide status`` reads it)
FEEDBACK_LOG = f"{PREFIX}:feedback:log"  # list, newest first: every feedback change with its evidence

_JOB = f"{PREFIX}:job:"
_NODE = f"{PREFIX}:node:"
_CAP = f"{PREFIX}:cap:"
_USED = f"{PREFIX}:used:"
_CLAIM = f"{PREFIX}:claim:"
_RESERVATION = f"{PREFIX}:resv:"
RESERVATION_PREFIX = _RESERVATION  # + reservation id: see reservation()
_REJECTED = f"{PREFIX}:rejected:"
_FEEDBACK_DONE = f"{PREFIX}:feedback:done:"


def job(job_id: str) -> str:
    """String: the job's ``JobRecord`` JSON."""
    return _JOB + job_id


def node(node_id: str) -> str:
    """JSON inventory (NodeDescription) and liveness of a node."""
    return _NODE + node_id


def capacity(node_id: str) -> str:
    """Hash resource-field -> capacity, written on registration."""
    return _CAP + node_id


def used(node_id: str) -> str:
    """Hash resource-field -> amount claimed; only the claim scripts write it."""
    return _USED + node_id


def claim(job_id: str, pod: str) -> str:
    """Hash: ``items`` (JSON list of [cap key, used key, field, amount]), ``alloc`` (JSON allocation), ``resv``."""
    return f"{_CLAIM}{job_id}:{pod}"


def reservation(resv: str) -> str:
    """Hash of a gang reservation (id ``<job>:<attempt>``): ``claims`` (JSON list of claim keys), ``expires_ms``."""
    return _RESERVATION + resv


def reservation_id(job_id: str, attempt: int) -> str:
    return f"{job_id}:{attempt}"


def rejected(job_id: str) -> str:
    """Rejection reason of a submission that never became a job (expires after a day)."""
    return _REJECTED + job_id


def feedback_done(job_id: str, kind: str) -> str:
    """Marker that the feedback loop has already counted this job's ``kind`` outcome."""
    return f"{_FEEDBACK_DONE}{job_id}:{kind}"


# ------------------------------------------------------------ parsing


def parse_claim(key: str) -> tuple[str, str]:
    """``{tide}:claim:<job>:<pod>`` -> (job, pod). Raises ValueError for any other key."""
    if not key.startswith(_CLAIM):
        raise ValueError(f"not a claim key: {key!r}")
    job_id, sep, pod = key[len(_CLAIM):].partition(":")
    if not sep or not job_id or not pod:
        raise ValueError(f"not a claim key: {key!r}")
    return job_id, pod


def parse_reservation_id(resv: str) -> tuple[str, int]:
    """``<job>:<attempt>`` -> (job, attempt). Raises ValueError when it is not one."""
    job_id, sep, attempt = resv.rpartition(":")
    if not sep or not job_id or not attempt.isdigit():
        raise ValueError(f"not a reservation id: {resv!r}")
    return job_id, int(attempt)


def parse_used(key: str) -> str:
    """``{tide}:used:<node>`` -> node. Raises ValueError for any other key."""
    if not key.startswith(_USED) or len(key) == len(_USED):
        raise ValueError(f"not a used key: {key!r}")
    return key[len(_USED):]
