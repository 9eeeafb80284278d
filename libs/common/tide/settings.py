"""Settings from the environment (``TIDE_`` prefix), one model for every process."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDE_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: str | None = None
    redis_url: str = "redis://127.0.0.1:6379/0"
    # high availability (docs/ha.md): TIDE_NATS_URL may list several servers, comma-separated
    nats_stream_replicas: int = Field(default=1, ge=1, le=5, description="replicas of every JetStream stream")
    redis_sentinels: str = Field(
        default="", description="'host:port,...' of Redis Sentinels: the master is found (and followed) through them;"
        " TIDE_REDIS_URL then only gives the user, password and db")
    redis_master_name: str = Field(default="tide", description="the master's name at the Sentinels")
    redis_sentinel_password: str | None = Field(default=None, description="the Sentinels' own password")

    log_format: str = Field(default="json", description="json or console")
    log_level: str = "info"
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop", description="the services' event loop: uvloop where installed, else asyncio's own")
    otlp_endpoint: str | None = Field(default=None, description="OTLP/HTTP traces endpoint; none = no export")
    telemetry_read_every_s: float = Field(
        default=0.05, ge=0.0, le=1.0,
        description="the placer and metrics take the agents' heartbeats on a connection of their own, read at "
                    "most this often (tide.bus.paced): one wake-up for all the heartbeats that came meanwhile, "
                    "where each woke the service (docs/benchmarks.md, issue 17 eleventh round); 0: as they come")
    ready_file: Path | None = Field(default=None, description="touched once the service is ready")

    # node agent
    node_id: str | None = None
    node_file: Path | None = None
    nvml_backend: str = Field(default="simulated", description="simulated or nvml")
    heartbeat_s: float = 2.0
    work_dir: Path = Path("/tmp/tide-agent")
    telemetry_s: float = Field(default=5.0, description="GPU samples ride on the heartbeat this often")
    inventory_s: float = Field(default=30.0, description="re-discover the node this often; re-register on change")
    node_labels: str = Field(default="", description="extra node labels: 'k=v,k2=v2' or a JSON object")
    runtime: str = Field(default="subprocess", description="subprocess, docker, podman or nerdctl")
    runtime_command: str | None = Field(default=None, description="container CLI path (default: the runtime name)")
    runtime_image: str | None = Field(default=None, description="default image (a pod's env TIDE_IMAGE wins)")
    cpu_pinning: bool = Field(default=True, description="pin pods to the CPUs of their GPUs' NUMA node")
    mps_dir: Path | None = Field(default=None, description="MPS pipe/log dirs (default <work_dir>/<node>/mps)")
    mig_auto_enable: bool = Field(default=True, description="may switch an idle GPU to MIG mode (if no reset)")
    node_lease_s: float = Field(
        default=20.0, description="an agent that has not reached NATS for this long stops its pods (self-fencing)")
    fence_grace_s: float = Field(default=5.0, description="self-fencing: SIGTERM, this long, then SIGKILL")

    # queue
    queue_intake_linger_s: float = Field(
        default=0.01, ge=0.0, le=0.1,
        description="while submissions come fast (queue_intake_linger_above_per_s), the queue handles a batch of "
                    "them this long after its first one came, with those that came meanwhile: one Redis call and one "
                    "event batch for all, and fewer wake-ups of every service per job (docs/benchmarks.md, issue 17 "
                    "tenth round); 0: each batch at once")
    queue_intake_linger_above_per_s: float = Field(
        default=200.0, ge=0.0,
        description="the intake lingers only while at least this many submissions a second came (over the last "
                    "0.25 s): below it a linger would add its delay to each job and save little; 0: always")
    queue_kick_window_s: float = Field(
        default=0.005, description="the queue kicks the placer at once, then at most once per this window")

    # placer
    placer_tick_s: float = 1.0
    placer_cycle_gap_s: float = Field(
        default=0.06, ge=0.0, le=0.5,
        description="while jobs come fast (placer_cycle_gap_above_per_s), a kicked cycle starts at least this long "
                    "after the last one started: fewer, larger cycles, for less CPU per job (tide_placer.pacing); "
                    "0: each kick at once")
    placer_cycle_gap_above_per_s: float = Field(
        default=200.0, ge=0.0,
        description="the gap holds only while at least this many jobs a second arrived (their queued events, over "
                    "the last 0.25 s): a trickle of jobs is placed at once; 0: always")
    placer_resync_s: float = Field(default=5.0, description="rebuild the cached cluster view from Redis this often")
    placer_bind_concurrency: int = Field(default=32, description="gangs bound (reserve, start, commit) at once")
    node_lost_after_s: float = Field(default=15.0, description="no heartbeat for this long: the node is lost")
    min_runtime_s: float = Field(default=60.0, description="a job runs this long before it can be preempted again")
    preemption_timeout_s: float = Field(default=120.0, description="wait this long for victims before preempting again")
    clock_file: Path | None = Field(default=None, description="injected wall clock for tides (tests, drills)")
    placer_policy: str = Field(default="default", description="placement policy (tide.core.POLICIES)")
    decision_log: Path | None = Field(
        default=None, description="append each cycle's snapshot and binds here as JSON lines (tide sim replay)")
    start_ack_timeout_s: float = 5.0
    reservation_ttl_s: float = Field(default=30.0, description="a gang's claims lapse unless committed by then")
    requeue_backoff_s: float = Field(default=0.5, description="first requeue delay; doubles per failed attempt")
    fault_pause_after_reserve_s: float = Field(
        default=0.0, description="fault injection for tests: stall between reserve and start"
    )
    placer_lease_ttl_s: float = Field(
        default=5.0, gt=0, description="placer leader lease: it lapses this long after the leader's last renewal")
    placer_lease_renew_s: float = Field(
        default=1.0, gt=0, description="the leader renews its lease (and a standby tries to take it) this often")
    placer_metrics_host: str = "127.0.0.1"
    placer_metrics_port: int = Field(default=9465, ge=0, description="the placer's Prometheus /metrics; 0: not served")

    # metrics
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464
    metrics_poll_s: float = Field(default=2.0, description="read allocation/queue state from Redis this often")
    metrics_queues_file: Path | None = Field(
        default=None, description="queue tree (YAML/JSON, {queues: [...]}) for lent/borrowed GPU guarantees"
    )
    feedback_enabled: bool = Field(default=True, description="the OOM/communication feedback loop acts")
    feedback_oom_step: float = Field(default=1.5, description="memory multiplier step per OOM")
    feedback_max_multiplier: float = Field(default=8.0, description="memory multiplier cap (and the device size)")
    feedback_decay_after: int = Field(default=2, description="clean runs before the multiplier decays")
    feedback_decay: float = Field(default=0.8, description="the multiplier's excess over 1 shrinks by this per run")
    feedback_traffic_bytes_per_s: float = Field(default=1e9, description="cross-node traffic that raises affinity")
    feedback_affinity_step: float = Field(default=1.0, description="affinity step (>= 1 prefers one node)")
    feedback_max_resubmits: int = Field(default=3, description="resubmissions of one OOM-failed job at most")

    # queue
    max_payload_bytes: int = 64 * 1024
    queue_config: Path | None = Field(default=None, description="YAML/JSON queue tree loaded at start")
    tenants_file: Path | None = Field(
        default=None, description="the tenants' policies (tide.stack.auth.TENANTS_FILE), re-read when it changes")
    max_pending_per_queue: int = Field(default=100_000, ge=1, description="pending jobs in one queue at most")
    max_pending_per_tenant: int = Field(
        default=10_000, ge=1, description="pending jobs of one tenant at most (a tenant's max_pending wins)")

    # CLI: act as this tenant (its credentials from the stack's stack.json); None: the admin
    user: str | None = None

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> Settings:
        """The lease is renewed by each heartbeat: shorter than two of them, a healthy agent fences itself."""
        if self.node_lease_s < 2 * self.heartbeat_s:
            raise ValueError(f"TIDE_NODE_LEASE_S ({self.node_lease_s:g}) must be at least twice TIDE_HEARTBEAT_S "
                             f"({self.heartbeat_s:g}): the node lease is renewed on each heartbeat")
        if self.placer_lease_ttl_s < 3 * self.placer_lease_renew_s - 1e-9:
            raise ValueError(f"TIDE_PLACER_LEASE_TTL_S ({self.placer_lease_ttl_s:g}) must be at least three times "
                             f"TIDE_PLACER_LEASE_RENEW_S ({self.placer_lease_renew_s:g}): a leader that misses one "
                             "renewal keeps its lease")
        return self
