"""compose.yaml stays a valid description of the whole stack."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tide.stack.auth import service_permissions

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


def _conf_permissions(user: str) -> dict[str, list[str]]:
    """The publish and subscribe allow lists of ``user`` in deploy/nats.conf."""
    text = (ROOT / "deploy/nats.conf").read_text()
    block = re.search(r"\{user: " + re.escape(user) + r",.*?allow_responses", text, re.S)
    assert block is not None, user
    lists = {kind: re.search(kind + r": \{allow: \[(.*?)\]", block.group(0), re.S) for kind in ("publish", "subscribe")}
    return {kind: re.findall(r'"([^"]+)"', m.group(1)) for kind, m in lists.items() if m is not None}


def _covers(pattern: str, subject: str) -> bool:
    """Whether the NATS permission ``pattern`` allows ``subject`` (itself possibly a pattern)."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]) or (token == "*" and s[i] == ">"):
            return False
    return len(p) == len(s)


@pytest.mark.parametrize("service", ["queue", "placer", "metrics"])
def test_compose_nats_conf_allows_what_each_service_uses_and_no_other_subject(service: str) -> None:
    """compose.yaml's NATS config grants each service what `tide up` grants it (tide.stack.auth): a subject added
    to one and not the other would fail only under compose. Outside the JetStream API (whose stream lookups the
    file grants by wildcard) it grants nothing more."""
    conf, want = _conf_permissions(service), service_permissions()[service]
    for kind in ("publish", "subscribe"):
        for subject in want[kind]:
            assert any(_covers(p, subject) for p in conf[kind]), f"{service} {kind} {subject}: not in deploy/nats.conf"
        for pattern in conf[kind]:
            if not pattern.startswith("$JS.API.STREAM."):
                assert any(_covers(w, pattern) for w in want[kind]), f"{service} {kind} {pattern}: not in auth.py"
