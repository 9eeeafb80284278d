"""Credentials and permissions: one NATS user per service and per node agent, Redis ACL users.

A node agent may publish only its own status, heartbeat and telemetry subjects and subscribe only to
its own command and logs subjects and its own inbox prefix; it does not touch Redis.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tide import subjects
from tide.store import keys

SERVICES = ("queue", "placer", "metrics")
JS_API = "$JS.API.>"
INBOX = "_INBOX.>"


def new_password() -> str:
    return secrets.token_hex(16)


def js_stream_lookup() -> list[str]:
    """Look up every stream (``ensure_streams`` checks them; only the queue may create or change one)."""
    return [f"$JS.API.STREAM.INFO.{sd.name}" for sd in subjects.STREAMS]


def js_stream_admin() -> list[str]:
    return [f"$JS.API.STREAM.{op}.{sd.name}" for sd in subjects.STREAMS for op in ("CREATE", "UPDATE")]


def js_msg_get(*streams: str) -> list[str]:
    """Read single messages of ``streams`` by sequence or subject (``$JS.API.STREAM.MSG.GET``): no consumer."""
    return [f"$JS.API.STREAM.MSG.GET.{name}" for name in streams]


def js_consumer(cdef: subjects.ConsumerDef) -> list[str]:
    """The JetStream API calls and acks of one durable pull consumer (``tide.bus.nats.consume``) and no other."""
    at = f"{cdef.stream}.{cdef.durable}"
    return [f"$JS.API.CONSUMER.CREATE.{at}", f"$JS.API.CONSUMER.CREATE.{at}.>", f"$JS.API.CONSUMER.DURABLE.CREATE.{at}",
            f"$JS.API.CONSUMER.INFO.{at}", f"$JS.API.CONSUMER.MSG.NEXT.{at}", f"$JS.ACK.{at}.>"]


def js_consumer_with_dlq(cdef: subjects.ConsumerDef) -> list[str]:
    """Its consumer, and the dead-letter subjects of that consumer only (``tide.bus.nats.dead_letter``)."""
    return [*js_consumer(cdef), subjects.dead_letters_of(cdef.durable)]


def service_inbox_prefix(name: str) -> str:
    """The only inbox prefix a service may subscribe to (its requests' and JetStream publishes' replies)."""
    return f"_INBOX_{name}"


def service_permissions() -> dict[str, dict[str, list[str]]]:
    return {
        "queue": {  # creates the streams where `tide up` did not (compose); its own intake consumer
            # reads a tenant's job history (MSG.GET on EVENTS and DLQ: read-only, no consumer) and forwards its
            # logs requests to the nodes, once it has checked that the job is the tenant's
            "publish": [subjects.JOB_REJECTED, subjects.EVENTS_ALL, subjects.EVENT_DIGEST, subjects.PLACER_KICK,
                        *js_stream_lookup(),
                        *js_stream_admin(), *js_consumer_with_dlq(subjects.QUEUE_INTAKE),
                        *js_msg_get("EVENTS", "DLQ"), subjects.NODE_LOGS_ALL],
            "subscribe": [subjects.API_STATUS, subjects.API_STATUS_TENANTS, subjects.API_HISTORY_TENANTS,
                          subjects.API_LOGS_TENANTS, subjects.API_QUEUES, subjects.API_QUEUES_APPLY,
                          f"{service_inbox_prefix('queue')}.>"],
        },
        "placer": {
            "publish": [subjects.EVENTS_ALL, subjects.EVENT_DIGEST, "tide.node.*.cmd", *js_stream_lookup(),
                        *js_consumer_with_dlq(subjects.PLACER_NODE_STATUS)],
            "subscribe": [subjects.PLACER_KICK, subjects.job_event("*", "queued"), subjects.API_NODES,
                          subjects.HEARTBEAT_ALL, subjects.TELEMETRY_ALL, subjects.PLACER_WEIGHTS,
                          f"{service_inbox_prefix('placer')}.>"],
        },
        "metrics": {
            # tide.jobs.submit[.<tenant>]: the feedback loop resubmits OOM-failed jobs with a larger share, a
            # tenant's job on that tenant's subject (the resubmission keeps its owner, queues and limits)
            "publish": [subjects.PLACER_WEIGHTS, subjects.JOB_SUBMIT, subjects.JOB_SUBMIT_TENANTS, *js_stream_lookup(),
                        *js_consumer_with_dlq(subjects.METRICS_EVENTS),
                        *js_consumer_with_dlq(subjects.METRICS_DEAD_LETTERS)],
            # tide.api.weights.<tenant>: a tenant's weights, only the families and history of its own jobs
            "subscribe": [subjects.EVENTS_ALL, subjects.EVENT_DIGEST, subjects.TELEMETRY_ALL, subjects.API_WEIGHTS,
                          subjects.API_WEIGHTS_TENANTS, f"{service_inbox_prefix('metrics')}.>"],
        },
        # people and scripts: submit, cancel, ask, watch
        "admin": {
            "publish": [subjects.JOB_SUBMIT, subjects.JOB_CANCEL, "tide.api.>", subjects.PLACER_KICK,
                        subjects.NODE_LOGS_ALL, JS_API],
            "subscribe": [subjects.EVENTS_ALL, subjects.JOB_REJECTED, INBOX],
        },
    }


def node_permissions(node_id: str) -> dict[str, list[str]]:
    return {
        "publish": [subjects.node_status(node_id), subjects.heartbeat(node_id), subjects.telemetry(node_id)],
        "subscribe": [subjects.node_cmd(node_id), subjects.node_logs(node_id),
                      f"{subjects.node_inbox_prefix(node_id)}.>"],
    }


# ------------------------------------------------------------ tenants (docs/security.md)
TENANT_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
RESERVED_NAMES = frozenset({*SERVICES, "admin", "tide", "default"})
TENANTS_FILE = "tenants.json"  # in the stack's home: the tenants' policies (no passwords); the queue reads it


@dataclass(frozen=True)
class Tenant:
    """Who may submit what: ``queues`` (and their sub-queues), priority classes up to ``max_priority``,
    at most ``max_pending`` pending jobs (None: the queue's TIDE_MAX_PENDING_PER_TENANT)."""

    name: str
    queues: list[str] = field(default_factory=lambda: ["default"])
    max_priority: str = "offline-training"
    max_pending: int | None = None


def check_tenant_name(name: str, node_ids: list[str] = ()) -> None:  # type: ignore[assignment]
    """ValueError unless ``name`` can be a tenant: NATS user, subject token and inbox prefix at once."""
    if not TENANT_NAME.match(name):
        raise ValueError(f"tenant name {name!r}: lowercase letters, digits and '-', starting with a letter")
    if name in RESERVED_NAMES or name.startswith(("node-", "tide-")) or name in node_ids:
        raise ValueError(f"tenant name {name!r} is reserved (a service, admin, or a node)")


def tenant_inbox_prefix(name: str) -> str:
    return f"_INBOX_{name}"


def tenant_permissions(name: str) -> dict[str, list[str]]:
    """A tenant publishes only its own submit/cancel/status/history/logs/weights subjects (the queue, and for the
    weights the metrics service, read the tenant from the subject and answer only for its jobs) and the read-only
    cluster APIs; it subscribes only to its own inbox (no job events, no JetStream API, no node logs subject, not
    the shared weights subject: those would show other tenants' jobs)."""
    return {
        "publish": [subjects.job_submit_as(name), subjects.job_cancel_as(name), subjects.api_status_as(name),
                    subjects.api_history_as(name), subjects.api_logs_as(name), subjects.api_weights_as(name),
                    subjects.API_QUEUES, subjects.API_NODES],
        "subscribe": [f"{tenant_inbox_prefix(name)}.>"],
    }


def load_tenants(path: Path) -> dict[str, Tenant]:
    if not path.exists():
        return {}
    raw = json.loads(path.read_text() or "{}")
    return {name: Tenant(name=name, **{k: v for k, v in t.items() if k != "name"}) for name, t in raw.items()}


def save_tenants(path: Path, tenants: dict[str, Tenant]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({n: asdict(t) for n, t in sorted(tenants.items())}, indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)


def node_user(node_id: str) -> str:
    return f"node-{node_id}"


# HA stack only (docs/ha.md): infrastructure users, never given to a service
ROUTE_USER = "tide-route"  # NATS cluster routes between the servers
REPLICATION_USER = "tide-replication"  # a Redis replica syncing from its primary (masteruser)
SENTINEL_USER = "tide-sentinel"  # the Sentinels on the Redis servers (sentinel auth-user)
SENTINEL_PASSWORD = "tide-sentinels"  # key in the passwords: the Sentinels' own password (requirepass)
HA_SECRETS = (ROUTE_USER, REPLICATION_USER, SENTINEL_USER, SENTINEL_PASSWORD)


@dataclass(frozen=True)
class NatsCluster:
    """This server's place in a NATS cluster: its name, its route port, the other servers' route ports."""

    server_name: str
    route_port: int
    peer_route_ports: list[int]
    http_port: int  # monitoring (/varz, /connz, /jsz) on the loopback


def nats_config(
    port: int, store_dir: str, passwords: dict[str, str], node_ids: list[str], host: str = "127.0.0.1",
    cluster: NatsCluster | None = None, tenants: list[str] = (),  # type: ignore[assignment]
) -> str:
    """A nats-server config with JetStream and one user per service, node and tenant; with ``cluster``, one
    server of a cluster whose routes authenticate as ``ROUTE_USER``."""
    lines = [
        f"listen: {json.dumps(f'{host}:{port}')}",
        f"server_name: {cluster.server_name if cluster else 'tide'}",
        "max_payload: 1MB",
        f"jetstream {{ store_dir: {json.dumps(store_dir)}, max_memory_store: 268435456 }}",
        *users_block(passwords, node_ids, tenants),
    ]
    if cluster is not None:
        secret = passwords[ROUTE_USER]
        routes = [f"nats-route://{ROUTE_USER}:{secret}@{host}:{p}" for p in cluster.peer_route_ports]
        lines += [
            f"http: {json.dumps(f'{host}:{cluster.http_port}')}",
            "cluster {",
            "  name: tide",
            f"  listen: {json.dumps(f'{host}:{cluster.route_port}')}",
            f"  authorization {{ user: {json.dumps(ROUTE_USER)}, password: {json.dumps(secret)}, timeout: 2 }}",
            f"  routes: {json.dumps(routes)}",
            "}",
        ]
    return "\n".join([*lines, ""])


USERS_BEGIN = "# tide users: begin"
USERS_END = "# tide users: end"


def users_block(passwords: dict[str, str], node_ids: list[str], tenants: list[str]) -> list[str]:
    """The ``authorization`` block, between markers so that ``tide user add`` can replace it in place."""
    users = []
    for name, perms in service_permissions().items():
        users.append(_user(name, passwords[name], perms))
    for node_id in node_ids:
        users.append(_user(node_user(node_id), passwords[node_user(node_id)], node_permissions(node_id)))
    for name in tenants:
        users.append(_user(name, passwords[name], tenant_permissions(name)))
    return [USERS_BEGIN, "authorization {", "  users = [", *[f"    {u}" for u in users], "  ]", "}", USERS_END]


def replace_users(conf: str, block: list[str]) -> str:
    """``conf`` with its users block replaced (the rest, cluster and JetStream settings included, unchanged)."""
    head, sep, rest = conf.partition(USERS_BEGIN + "\n")
    _, sep2, tail = rest.partition(USERS_END + "\n")
    if not sep or not sep2:
        raise ValueError("no tide users block in the NATS config (written by an older `tide up`?)")
    return head + "\n".join(block) + "\n" + tail


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


def redis_acl_lines(passwords: dict[str, str], ha: bool = False) -> list[str]:
    """Valkey/Redis ACL: the default user off, each service limited to ``{tide}:*`` keys (``keys.ACL_PATTERN``:
    the ``{tide}`` hash tag every key carries). With ``ha``, also a
    replication user (only what a replica needs) and the Sentinels' user (the commands Redis documents for it)."""
    lines = ["user default off"]
    for name in SERVICES:
        lines.append(f"user {name} on >{passwords[name]} ~{keys.ACL_PATTERN} &* +@all -@dangerous")
    if ha:
        lines.append(f"user {REPLICATION_USER} on >{passwords[REPLICATION_USER]} +psync +replconf +ping")
        lines.append(
            f"user {SENTINEL_USER} on >{passwords[SENTINEL_USER]} allchannels +multi +slaveof +replicaof +ping +exec"
            " +subscribe +config|rewrite +role +publish +info +client|setname +client|kill +script|kill"
        )
    return lines
