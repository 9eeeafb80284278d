"""Credentials and permissions: one NATS user per service and per node agent, Redis ACL users.

A node agent may publish only its own status and telemetry subjects and subscribe only to
its own command subject and its own inbox prefix; it does not touch Redis.
"""

from __future__ import annotations

import json
import secrets

from tide import subjects

SERVICES = ("queue", "placer", "metrics")
JS_API = "$JS.API.>"
JS_ACK = "$JS.ACK.>"
INBOX = "_INBOX.>"


def new_password() -> str:
    return secrets.token_hex(16)


def service_permissions() -> dict[str, dict[str, list[str]]]:
    return {
        "queue": {
            "publish": [subjects.JOB_REJECTED, subjects.EVENTS_ALL, subjects.PLACER_KICK, JS_API, JS_ACK],
            "subscribe": [subjects.API_STATUS, subjects.API_QUEUES, subjects.API_QUEUES_APPLY, INBOX],
        },
        "placer": {
            "publish": [subjects.EVENTS_ALL, "tide.node.*.cmd", JS_API, JS_ACK],
            "subscribe": [subjects.PLACER_KICK, subjects.API_NODES, subjects.TELEMETRY_ALL,
                          subjects.PLACER_WEIGHTS, INBOX],
        },
        "metrics": {
            # tide.jobs.submit: the feedback loop resubmits OOM-failed jobs with a larger share
            "publish": [subjects.PLACER_WEIGHTS, subjects.JOB_SUBMIT, JS_API, JS_ACK],
            "subscribe": [subjects.EVENTS_ALL, subjects.TELEMETRY_ALL, subjects.API_WEIGHTS, INBOX],
        },
        # people and scripts: submit, cancel, ask, watch
        "admin": {
            "publish": [subjects.JOB_SUBMIT, subjects.JOB_CANCEL, "tide.api.>", subjects.PLACER_KICK, JS_API],
            "subscribe": [subjects.EVENTS_ALL, subjects.JOB_REJECTED, INBOX],
        },
    }


def node_permissions(node_id: str) -> dict[str, list[str]]:
    return {
        "publish": [subjects.node_status(node_id), subjects.telemetry(node_id)],
        "subscribe": [subjects.node_cmd(node_id), f"{subjects.node_inbox_prefix(node_id)}.>"],
    }


def node_user(node_id: str) -> str:
    return f"node-{node_id}"


def nats_config(
    port: int, store_dir: str, passwords: dict[str, str], node_ids: list[str], host: str = "127.0.0.1"
) -> str:
    """A nats-server config with JetStream and one user per service and node."""
    users = []
    for name, perms in service_permissions().items():
        users.append(_user(name, passwords[name], perms))
    for node_id in node_ids:
        users.append(_user(node_user(node_id), passwords[node_user(node_id)], node_permissions(node_id)))
    return "\n".join(
        [
            f"listen: {json.dumps(f'{host}:{port}')}",
            "server_name: tide",
            "max_payload: 1MB",
            f"jetstream {{ store_dir: {json.dumps(store_dir)}, max_memory_store: 268435456 }}",
            "authorization {",
            "  users = [",
            *[f"    {u}" for u in users],
            "  ]",
            "}",
            "",
        ]
    )


def _user(name: str, password: str, perms: dict[str, list[str]]) -> str:
    return json.dumps(
        {
            "user": name,
            "password": password,
            "permissions": {
                "publish": {"allow": perms["publish"]},
                "subscribe": {"allow": perms["subscribe"]},
                "allow_responses": True,
            },
        }
    )


def redis_acl_lines(passwords: dict[str, str]) -> list[str]:
    """Valkey/Redis ACL: the default user off, each service limited to ``tide:*`` keys."""
    lines = ["user default off"]
    for name in SERVICES:
        lines.append(f"user {name} on >{passwords[name]} ~tide:* &* +@all -@dangerous")
    return lines
