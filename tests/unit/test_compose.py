"""compose.yaml stays a valid description of the whole stack."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_has_every_part() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    for name in ("nats", "redis", "queue", "placer", "metrics", "node-agent-0", "node-agent-1", "prometheus",
                 "grafana"):
        assert name in services, name
    for name in ("queue", "placer", "metrics", "node-agent-0"):
        env = services[name]["environment"]
        assert env["TIDE_NATS_URL"].startswith("nats://nats:")
        assert env["TIDE_NATS_USER"] and env["TIDE_NATS_PASSWORD"]
    for path in ("deploy/nats.conf", "deploy/prometheus.yml", "deploy/grafana/provisioning/datasources/tide.yaml"):
        assert (ROOT / path).exists(), path


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_compose_validates_with_docker_compose() -> None:
    out = subprocess.run(["docker-compose", "-f", str(ROOT / "compose.yaml"), "config", "-q"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
