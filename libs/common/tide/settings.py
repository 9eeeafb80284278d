"""Settings from the environment (``TIDE_`` prefix), one model for every process."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDE_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: str | None = None
    redis_url: str = "redis://127.0.0.1:6379/0"

    log_format: str = Field(default="json", description="json or console")
    log_level: str = "info"
    otlp_endpoint: str | None = Field(default=None, description="OTLP/HTTP traces endpoint; none = no export")
    ready_file: Path | None = Field(default=None, description="touched once the service is ready")

    # node agent
    node_id: str | None = None
    node_file: Path | None = None
    nvml_backend: str = Field(default="simulated", description="simulated or nvml")
    heartbeat_s: float = 2.0
    work_dir: Path = Path("/tmp/tide-agent")

    # placer
    placer_tick_s: float = 1.0
    placer_policy: str = Field(default="default", description="placement policy (tide.core.POLICIES)")
    start_ack_timeout_s: float = 5.0

    # metrics
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464

    # queue
    max_payload_bytes: int = 64 * 1024
