"""Every NATS subject and JetStream stream Tide uses, defined once.

Commands to node agents are core-NATS request/reply (the agent's reply is its
acknowledgement), so the NODE stream captures only the agents' status subjects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFIX = "tide"

# Job intake (stream JOBS)
JOBS_ALL = f"{PREFIX}.jobs.>"
JOB_SUBMIT = f"{PREFIX}.jobs.submit"
JOB_CANCEL = f"{PREFIX}.jobs.cancel"
JOB_REJECTED = f"{PREFIX}.jobs.rejected"
# A tenant submits and cancels on its own subjects (docs/security.md): the queue takes the tenant from the
# subject's last token, never from the payload. The plain subjects above are the admin's.
JOB_SUBMIT_TENANTS = f"{PREFIX}.jobs.submit.*"
JOB_CANCEL_TENANTS = f"{PREFIX}.jobs.cancel.*"


def job_submit_as(tenant: str) -> str:
    return f"{JOB_SUBMIT}.{tenant}"


def job_cancel_as(tenant: str) -> str:
    return f"{JOB_CANCEL}.{tenant}"


def tenant_of(subject: str) -> str | None:
    """The tenant a submit/cancel/status/history/logs/weights subject speaks for; None for the admin's plain
    subjects."""
    for base in (JOB_SUBMIT, JOB_CANCEL, f"{PREFIX}.api.status", f"{PREFIX}.api.history", f"{PREFIX}.api.logs",
                 f"{PREFIX}.api.weights"):
        if subject.startswith(base + "."):
            return subject[len(base) + 1:]
    return None

# Job lifecycle events (stream EVENTS): tide.events.job.<job_id>.<kind>
EVENTS_ALL = f"{PREFIX}.events.>"
JOB_EVENTS_ALL = f"{PREFIX}.events.job.>"


# Every kind of job event. The terminal ones end a job's story; the others are its progress. A kind not listed
# here cannot be published: ``job_event`` refuses it.
TERMINAL_EVENT_KINDS = ("succeeded", "failed", "cancelled", "rejected")
PROGRESS_EVENT_KINDS = ("queued", "placed", "running", "unschedulable", "requeued", "preempted", "pod-preempted",
                        "pod-started", "pod-exited", "checkpoint", "extras-placed", "extras-requeued", "shrunk")
JOB_EVENT_KINDS = frozenset(TERMINAL_EVENT_KINDS + PROGRESS_EVENT_KINDS)
# The kinds the metrics service must not miss come to it through its durable consumer: a failure may be an OOM,
# which the feedback loop answers with a resubmission (a job), and cancellations and rejections are rare. Every
# other kind comes in the publishers' digests (``EVENT_DIGEST``, at most once), success included: all it does in
# metrics is count, time, and decay a family's memory multiplier after a clean run (a missed one leaves the
# multiplier for the next clean run to decay). One delivery per digest instead of a delivery and an ack per job.
DURABLE_EVENT_KINDS = ("failed", "cancelled", "rejected")
DIGEST_EVENT_KINDS = frozenset(JOB_EVENT_KINDS - set(DURABLE_EVENT_KINDS))


def job_event(job_id: str, kind: str) -> str:
    """The subject of one job event (``kind``: one of ``JOB_EVENT_KINDS``, or ``*``)."""
    if kind not in JOB_EVENT_KINDS and kind != "*":
        raise ValueError(f"unknown job event kind {kind!r}: add it to tide.subjects' event kinds")
    return f"{PREFIX}.events.job.{job_id}.{kind}"


# The progress events a service published in the last moment, gathered into one core-NATS message for the metrics
# service (``tide.events.EventPublisher``): one delivery per digest instead of one per event. Outside every
# stream: at most once, as metrics' counters and histograms need (the durable record is each event's own subject).
EVENT_DIGEST = f"{PREFIX}.metrics.digest"


def job_events(job_id: str) -> str:
    return f"{PREFIX}.events.job.{job_id}.>"


# Node agents (stream NODE for status; commands are request/reply)
NODE_STATUS_ALL = f"{PREFIX}.node.*.status"


def node_status(node_id: str) -> str:
    return f"{PREFIX}.node.{node_id}.status"


def node_cmd(node_id: str) -> str:
    return f"{PREFIX}.node.{node_id}.cmd"


NODE_LOGS_ALL = f"{PREFIX}.node.*.logs"


def node_logs(node_id: str) -> str:
    """Pod logs, request/reply: the node's agent answers from its work dir (tide_node_agent/logs.py)."""
    return f"{PREFIX}.node.{node_id}.logs"


def node_inbox_prefix(node_id: str) -> str:
    """The only inbox prefix a node agent may subscribe to (for its JetStream publish acks)."""
    return f"_INBOX_{node_id}"


# Heartbeats and telemetry. Each heartbeat of an agent is one message: on ``tide.telemetry.<id>`` when it carries
# GPU samples (every ``TIDE_TELEMETRY_S``; stream TELEMETRY keeps them, metrics reads them), else on
# ``tide.heartbeat.<id>`` (no stream: the placer's liveness only). The placer takes both as heartbeats.
TELEMETRY_ALL = f"{PREFIX}.telemetry.>"
HEARTBEAT_ALL = f"{PREFIX}.heartbeat.>"


def telemetry(node_id: str) -> str:
    """A node's heartbeats that carry GPU samples."""
    return f"{PREFIX}.telemetry.{node_id}"


def heartbeat(node_id: str) -> str:
    """A node's heartbeats without GPU samples."""
    return f"{PREFIX}.heartbeat.{node_id}"


def heartbeat_node(subject: str) -> str | None:
    """The node a heartbeat's subject (either kind) names; None for any other subject."""
    for prefix in (heartbeat(""), telemetry("")):
        if subject.startswith(prefix):
            node_id = subject.removeprefix(prefix)
            return node_id if node_id and "." not in node_id else None
    return None


PODS_HEADER = "Tide-Pods"
"""Heartbeat header: the pods the agent runs, ``<job>/<pod>.a<attempt>`` comma-separated (the placer reads
it without parsing the body, and stops any pod whose attempt is not the job's current one)."""
PODS_AT_HEADER = "Tide-Pods-At"
"""Heartbeat header: when the agent took its ``PODS_HEADER`` list (Unix seconds, its clock), so that a pod whose exit
it reported after that is not judged by the list (``tide_placer.reports``)."""


# Feedback loop output
PLACER_WEIGHTS = f"{PREFIX}.placer.weights"
# Wake-up hint for the placer's scheduling cycle (core NATS; losing one only delays a cycle)
PLACER_KICK = f"{PREFIX}.placer.kick"

# Request/reply APIs used by the CLI
API_STATUS = f"{PREFIX}.api.status"
API_STATUS_TENANTS = f"{PREFIX}.api.status.*"  # a tenant's status requests: only its own jobs


def api_status_as(tenant: str) -> str:
    return f"{API_STATUS}.{tenant}"


# A tenant's reads of one of its jobs that the servers cannot confine by subject (the EVENTS and DLQ streams are
# keyed by job id, a node's logs subject by node): the queue checks that the job is the tenant's, then reads the
# job's events and dead letters, or forwards the logs request to the node, for it (docs/security.md).
API_HISTORY = f"{PREFIX}.api.history"
API_HISTORY_TENANTS = f"{PREFIX}.api.history.*"
API_LOGS = f"{PREFIX}.api.logs"
API_LOGS_TENANTS = f"{PREFIX}.api.logs.*"


def api_history_as(tenant: str) -> str:
    return f"{API_HISTORY}.{tenant}"


def api_logs_as(tenant: str) -> str:
    return f"{API_LOGS}.{tenant}"


API_QUEUES = f"{PREFIX}.api.queues"
API_QUEUES_APPLY = f"{PREFIX}.api.queues.apply"  # admin: replace the queue tree at run time
API_NODES = f"{PREFIX}.api.nodes"

# Dead letters (stream DLQ): tide.dlq.<consumer durable>.<job id or "_">. A message a consumer's handler failed on
# too often goes there with the reason (``tide.bus.dead_letters``); each service may publish only on its own
# consumers' subjects.
DLQ_ALL = f"{PREFIX}.dlq.>"
NO_JOB = "_"


def dead_letter(durable: str, job_id: str | None = None) -> str:
    """``job_id`` must be one subject token (``tide.bus.dead_letters.job_id_of`` checks it)."""
    return f"{PREFIX}.dlq.{durable}.{job_id or NO_JOB}"


def dead_letters_of(durable: str) -> str:
    """Every dead-letter subject of one consumer (a service's publish permission)."""
    return f"{PREFIX}.dlq.{durable}.*"


def job_dead_letters(job_id: str) -> str:
    return f"{PREFIX}.dlq.*.{job_id}"


@dataclass(frozen=True)
class StreamDef:
    name: str
    subjects: list[str]
    max_age_s: float
    max_msgs_per_subject: int = -1
    description: str = ""
    max_msgs: int = -1
    duplicate_window_s: float = 120.0
    allow_batched: bool = False
    """takes fast-ingest batches (``tide.bus.nats.FastBatches``; nats-server 2.14+)"""


@dataclass(frozen=True)
class ConsumerDef:
    stream: str
    durable: str
    filter_subjects: list[str] = field(default_factory=list)
    ack_wait_s: float = 30.0
    max_deliver: int = 10
    dead_letter_after: int = 5
    """a message whose handler raised on this many deliveries goes to the DLQ stream and is acked (a transient
    error, e.g. Redis away, waits for ``max_deliver``); ``TIDE_DEAD_LETTER_AFTER`` overrides it"""


DAY_S = 24 * 3600.0
STREAMS: list[StreamDef] = [
    StreamDef("JOBS", [JOBS_ALL], 7 * DAY_S, description="job submissions, cancellations and rejections"),
    StreamDef("EVENTS", [EVENTS_ALL], 7 * DAY_S, description="job lifecycle events", allow_batched=True),
    StreamDef("NODE", [NODE_STATUS_ALL], 7 * DAY_S, description="node agent registrations and pod status"),
    StreamDef("TELEMETRY", [TELEMETRY_ALL], 3600.0, max_msgs_per_subject=1000, description="GPU telemetry"),
    StreamDef("DLQ", [DLQ_ALL], 7 * DAY_S, max_msgs=10_000,
              description="dead letters: messages a service's handler failed on, with the reason"),
]

QUEUE_INTAKE = ConsumerDef("JOBS", "queue-intake", [JOB_SUBMIT, JOB_CANCEL, JOB_SUBMIT_TENANTS, JOB_CANCEL_TENANTS])
PLACER_NODE_STATUS = ConsumerDef("NODE", "placer-node-status", [NODE_STATUS_ALL])
METRICS_EVENTS = ConsumerDef("EVENTS", "metrics-events", [EVENTS_ALL])
METRICS_DEAD_LETTERS = ConsumerDef("DLQ", "metrics-dead-letters", [DLQ_ALL])  # counts them (tide_dead_letters)

# The feedback loop's weights per job family (request/reply, served by the metrics service): every family and
# the whole history on the admin's subject; on a tenant's own subject only the families of its jobs and the
# history of its jobs (docs/security.md)
API_WEIGHTS = f"{PREFIX}.api.weights"
API_WEIGHTS_TENANTS = f"{PREFIX}.api.weights.*"


def api_weights_as(tenant: str) -> str:
    return f"{API_WEIGHTS}.{tenant}"
