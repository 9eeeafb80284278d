"""Messages on the bus. Every message carries ``schema_version``, ``event_id`` and ``ts``.

Events are past-tense facts; commands to node agents are imperative and answered by a
``CommandAck``. The ``event_id`` doubles as JetStream's ``Nats-Msg-Id`` for de-duplication.
"""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from tide.schemas.job import JobSpec
from tide.schemas.node import NodeDescription

SCHEMA_VERSION = 1
JOB_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
JobId = Annotated[str, Field(pattern=JOB_ID_PATTERN)]


def new_event_id() -> str:
    return uuid.uuid4().hex


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: str = Field(default_factory=new_event_id)
    ts: float = Field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


# ---------------------------------------------------------------- intake
class SubmitJob(Message):
    """Published by users on ``tide.jobs.submit``. ``job_id`` is chosen by the queue when absent."""

    job_id: JobId | None = None
    spec: JobSpec


class CancelJob(Message):
    job_id: JobId
    reason: str = "cancelled by user"


class JobRejected(Message):
    job_id: str | None = None
    field: str
    reason: str


# ---------------------------------------------------------------- job state
class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    UNSCHEDULABLE = "unschedulable"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED})


class PodState(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


POD_DONE_STATES = frozenset({PodState.SUCCEEDED, PodState.FAILED, PodState.STOPPED})


class PodRecord(BaseModel):
    name: str
    index: int
    state: PodState = PodState.PENDING
    node: str | None = None
    gpus: list[str] = Field(default_factory=list, description="GPU (or MIG) UUIDs")
    exit_code: int | None = None
    reason: str | None = None
    stopping: bool = Field(default=False, description="an elastic extra being stopped by a preemption")
    attempt: int | None = Field(default=None, description="its fencing token (the job attempt that placed it); "
                                                          "None: the job's attempts")


class JobRecord(BaseModel):
    """The authoritative record of a job, kept in Redis."""

    job_id: str
    spec: JobSpec
    state: JobState = JobState.PENDING
    reason: str = ""
    submitted_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    cancel_requested: bool = False
    reservation: str | None = Field(default=None, description="open gang reservation (until commit)")
    nominated_at: float | None = Field(default=None, description="when it started preempting victims to fit")
    preemptions: int = Field(default=0, description="times it was preempted")
    preempted_by: str | None = None
    last_checkpoint_at: float | None = Field(default=None, description="last acknowledged checkpoint")
    avoid_nodes: list[str] = Field(default_factory=list, description="nodes that failed to start this job")
    not_before: float = Field(default=0.0, description="requeue backoff: not placed before this time")
    queued_at: float | None = Field(default=None, description="when it was last (re)queued; None: submitted_at")
    pods: list[PodRecord] = Field(default_factory=list)
    owner: str | None = Field(default=None, description="the submitting tenant (from its subject); None: admin")
    trace_parent: str | None = Field(
        default=None, description="W3C traceparent of the queue's intake span: the placer's spans for the job (and "
                                  "so the agents') continue its trace. None: submitted untraced, or before this field")

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    def working_copy(self) -> JobRecord:
        """A copy to change, equal to this one: its own pods (with their GPU lists) and list of nodes to avoid;
        the spec is shared, since a change replaces a job's spec and never edits it. A third of a parse's cost."""
        return self.model_copy(update={
            "pods": [p.model_copy(update={"gpus": list(p.gpus)}) for p in self.pods],
            "avoid_nodes": list(self.avoid_nodes)})


class JobEvent(Message):
    """A lifecycle fact on ``tide.events.job.<job_id>.<kind>``."""

    job_id: str
    kind: str
    state: JobState
    reason: str = ""
    pod: str | None = None
    node: str | None = None
    exit_code: int | None = None
    queue: str | None = None
    priority_class: str | None = None
    wait_s: float | None = None
    gang: int | None = Field(default=None, description="the job's gang size (minMember, else replicas)")
    family: str | None = Field(default=None, description="the job's family, the feedback loop's key: its 'family' "
                               "label, else a digest of its command")


class JobEventDigest(Message):
    """Progress events one service published, in the order it published them (``subjects.EVENT_DIGEST``)."""

    events: list[JobEvent]


# ---------------------------------------------------------------- node agents
class NodeRegistered(Message):
    kind: Literal["registered"] = "registered"
    node: NodeDescription
    running_pods: list[str] = Field(default_factory=list, description="'<job_id>/<pod>' the agent still runs")
    lease_s: float | None = Field(default=None, description="the agent stops its pods after this long unreached")
    fence_grace_s: float | None = Field(default=None, description="... with this grace (SIGTERM, then SIGKILL)")
    heartbeat_s: float | None = Field(default=None, description="the agent's heartbeat interval")
    exited: list[PodExited] = Field(
        default_factory=list, description="the agent's recent pod exits: a pod missing from running_pods that "
        "is here ended so (its PodExited may still be on its way), not lost")


class PodStarted(Message):
    kind: Literal["pod-started"] = "pod-started"
    node_id: str
    job_id: str
    pod: str
    pid: int


class ExitReason(StrEnum):
    COMPLETED = "Completed"
    ERROR = "Error"
    OOM = "OOM"
    STOPPED = "Stopped"
    START_FAILED = "StartFailed"
    LOST = "Lost"


class PodExited(Message):
    kind: Literal["pod-exited"] = "pod-exited"
    node_id: str
    job_id: str
    pod: str
    exit_code: int | None
    signal: int | None = None
    reason: ExitReason
    message: str = ""
    peak_memory_bytes: int | None = Field(default=None, description="peak GPU memory of the pod's processes")
    memory_limit_bytes: int | None = Field(default=None, description="the GPU memory the pod was given")
    checkpointed: bool = Field(default=False, description="it acknowledged a checkpoint before it stopped")


PodTransition = Annotated[PodStarted | PodExited, Field(discriminator="kind")]


class PodStatusBatch(Message):
    """Every pod transition of one node since its last status message, in the order they happened: an agent
    sends one per heartbeat that has any (one stream message, one delivery and one ack for all of them)."""
    kind: Literal["pod-status"] = "pod-status"
    node_id: str
    items: list[PodTransition] = Field(default_factory=list)


NodeStatus = Annotated[NodeRegistered | PodStarted | PodExited | PodStatusBatch, Field(discriminator="kind")]


NODE_STATUS = TypeAdapter(NodeStatus)


NodeRegistered.model_rebuild()  # its ``exited`` names PodExited, defined after it


class GpuAssignment(BaseModel):
    index: int
    uuid: str
    milli: int = 1000
    memory_mib: int | None = None
    mig_profile: str | None = None
    mig_start: int | None = None
    mig_create: bool = Field(default=False, description="the MIG instance must be created first")


class StartPod(Message):
    kind: Literal["start"] = "start"
    job_id: str
    pod: str
    pod_index: int
    world_size: int
    command: list[str]
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuAssignment] = Field(default_factory=list)
    share_sm_percent: int | None = None
    share_memory_mib: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    expires_at: float | None = Field(
        default=None, description="wall time after which the agent must not start it (the placer gave up)")
    job_floor: int | None = Field(
        default=None, description="the oldest attempt of the job still live (elastic extras start with a newer "
                                  "one beside it); older pods of the job are stale. None: this start's attempt")
    traceparent: str | None = Field(
        default=None, description="W3C traceparent of the placer's start span for this job: the agent's span for "
                                  "this start continues it (a StartPods' one header can name only one job's trace)")


class StopPod(Message):
    kind: Literal["stop"] = "stop"
    job_id: str
    pod: str
    grace_s: float = 10.0
    reason: str = "stopped"


class SettlePod(Message):
    """What became of a pod whose start went unanswered (the reply or the agent's connection was lost)?
    Answered with its ``PodFate``; an agent that never started it refuses that attempt from then on, so
    an ``absent`` answer is final and the placer may roll the attempt back without a pod running."""
    kind: Literal["settle"] = "settle"
    job_id: str
    pod: str


class StartPods(Message):
    """Every pod start of one placer cycle for one node, in one request: the agent handles them in order, each
    as a ``StartPod`` (its own fencing token and expiry), and answers one ``CommandAck`` whose ``acks`` hold
    each start's answer in the same order."""
    kind: Literal["start-batch"] = "start-batch"
    starts: list[StartPod]

    @property
    def job_id(self) -> str:  # for logs and spans: the first start's job
        return self.starts[0].job_id if self.starts else ""

    @property
    def pod(self) -> str:
        return ",".join(s.pod for s in self.starts)


NodeCommand = Annotated[StartPod | StartPods | StopPod | SettlePod, Field(discriminator="kind")]


NODE_COMMAND = TypeAdapter(NodeCommand)


def agent_pod_id(pod: str, attempt: int) -> str:
    """The id a node agent knows a pod by: its name and the placement attempt that started it."""
    return f"{pod}.a{attempt}"


def parse_agent_pod_id(agent_pod: str) -> tuple[str, int]:
    name, _, attempt = agent_pod.rpartition(".a")
    return (name, int(attempt)) if name and attempt.isdigit() else (agent_pod, 0)


class PodFate(StrEnum):
    """A node agent's answer to ``SettlePod``."""
    RUNNING = "running"  # started and still running
    EXITED = "exited"  # started and already ended (its PodExited is on the status stream)
    ABSENT = "absent"  # never started here, and now never will


class CommandAck(BaseModel):
    ok: bool
    error: str = ""
    fate: PodFate | None = Field(default=None, description="the answer to a SettlePod")
    exited: PodExited | None = Field(default=None, description="with fate 'exited': how the pod ended")
    started: bool = Field(default=False, description="a start answered: the pod runs (launched now or before)")
    acks: list[CommandAck] = Field(default_factory=list, description="a StartPods' answers, one per start")


class ProcessSample(BaseModel):
    pid: int
    memory_bytes: int
    mig_uuid: str | None = None


class GpuSample(BaseModel):
    index: int
    uuid: str
    utilization_ratio: float = 0.0
    memory_used_bytes: int = 0
    memory_total_bytes: int = 0
    memory_bandwidth_ratio: float = 0.0
    pcie_tx_bytes_per_s: float = 0.0
    pcie_rx_bytes_per_s: float = 0.0
    sm_clock_hz: float = 0.0
    power_watts: float = 0.0
    temperature_c: float = 0.0
    nvlink_tx_bytes_per_s: float = 0.0
    nvlink_rx_bytes_per_s: float = 0.0
    ecc_uncorrected_errors: int = 0
    xid_errors: list[int] = Field(default_factory=list, description="XID codes seen since the last sample")
    processes: list[ProcessSample] = Field(default_factory=list, description="per-process GPU memory (NVML)")


class PodUsage(BaseModel):
    """What one pod used since it started (telemetry, per job)."""

    job_id: str
    pod: str
    gpu_memory_bytes: int = 0
    peak_memory_bytes: int = 0
    pcie_bytes: float = 0.0
    nvlink_bytes: float = 0.0
    network_bytes: int | None = Field(default=None, description="only when the pod has its own network namespace")


class Telemetry(Message):
    """A heartbeat: with per-GPU samples on ``tide.telemetry.<node_id>``, without on ``tide.heartbeat.<node_id>``."""

    node_id: str
    running_pods: int = 0
    gpus: list[GpuSample] = Field(default_factory=list)
    seq: int = Field(default=0, description="heartbeat counter since the agent started")
    heartbeat_s: float | None = Field(default=None, description="the agent's heartbeat interval")
    pods: list[PodUsage] = Field(default_factory=list, description="per-pod usage (with GPU samples only)")
