"""``tide up``: NATS (JetStream), Redis, the four services and N simulated node agents on one machine.

Every process is started in its own session; its pids, endpoints and generated credentials are
written to ``<home>/stack.json`` (mode 0600). Once the stack is up a supervisor thread restarts any
process that exits without being asked to (backoff in ``tide.stack.supervision``) and keeps
``<home>/health.json`` current. Every process carries ``TIDE_STACK_HOME=<home>`` in its environment
(and so do the pods the agents start), which lets ``tide down`` find stragglers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import structlog
import yaml

from tide import subjects
from tide.bus.nats import connect, ensure_streams
from tide.schemas.node import ClusterDescription, NodeDescription, default_h100_node, load_node_file
from tide.settings import Settings
from tide.stack.auth import (
    HA_SECRETS,
    REPLICATION_USER,
    SENTINEL_PASSWORD,
    SENTINEL_USER,
    SERVICES,
    TENANTS_FILE,
    NatsCluster,
    Tenant,
    check_tenant_name,
    load_tenants,
    nats_config,
    new_password,
    node_user,
    redis_acl_lines,
    replace_users,
    save_tenants,
    users_block,
)
from tide.stack.servers import (
    StackError,
    free_port,
    nats_server_binary,
    nats_server_env,
    redis_config,
    redis_server_binary,
    sentinel_config,
    wait_tcp,
)
from tide.stack.supervision import (
    HEALTH_FILE,
    ProcessHealth,
    backoff_s,
    crashes_in_a_row,
    health_document,
    read_health,
    write_health,
)

HOST = "127.0.0.1"
SERVICE_MODULES = {"queue": "tide_queue", "placer": "tide_placer", "metrics": "tide_metrics"}
STACK_MARKER = "TIDE_STACK_HOME"  # in the environment of every process a stack starts
STOPPING_FILE = "stopping"  # `tide down` writes it first: a supervisor that sees it restarts nothing more
SUPERVISE_EVERY_S = 0.1
HEALTH_EVERY_S = 2.0
HA_SIZE = 3  # NATS servers and Sentinels in an HA stack (a quorum of 2 survives one loss)
HA_MASTER_NAME = "tide"
SERVER_PREFIXES = ("nats", "redis", "sentinel")  # stopped after the services and agents

log = structlog.get_logger()


def default_home() -> Path:
    return Path(os.environ.get("TIDE_HOME", Path.home() / ".tide"))


@dataclass
class StackInfo:
    home: str
    nats_url: str
    redis_host: str
    redis_port: int
    metrics_url: str
    passwords: dict[str, str]
    node_ids: list[str]
    pids: dict[str, int] = field(default_factory=dict)
    supervisor_pid: int | None = None  # the foreground `tide up` that supervises the stack (`tide down` stops it)
    # high availability (docs/ha.md): nats_url lists every server; Redis is found through the Sentinels
    ha: bool = False
    redis_sentinels: str = ""  # "host:port,..." of the Sentinels
    redis_master_name: str = ""
    ports: dict[str, int] = field(default_factory=dict)  # server process -> its client port
    monitor_ports: dict[str, int] = field(default_factory=dict)  # NATS server process -> its monitoring port
    tenants: list[str] = field(default_factory=list)  # NATS users of tenants (passwords in ``passwords``)
    placer_metrics_urls: dict[str, str] = field(default_factory=dict)  # placer process -> its /metrics

    def redis_url(self, user: str) -> str:
        """In an HA stack the host and port are those of the first primary: the Sentinels name the current one."""
        return f"redis://{user}:{self.passwords[user]}@{self.redis_host}:{self.redis_port}/0"

    def settings_for(self, user: str, **extra: object) -> Settings:
        ha: dict[str, object] = {}
        if self.ha:
            ha = dict(nats_stream_replicas=HA_SIZE, redis_sentinels=self.redis_sentinels,
                      redis_master_name=self.redis_master_name,
                      redis_sentinel_password=self.passwords[SENTINEL_PASSWORD] if user in SERVICES else None)
        if user in self.tenants:  # a tenant acts on its own subjects (TideClient)
            extra = {"user": user, **extra}
        return Settings(
            nats_url=self.nats_url,
            nats_user=user,
            nats_password=self.passwords[user],
            redis_url=self.redis_url(user) if user in SERVICES else "",
            **{**ha, **extra},
        )

    def env_for(self, user: str) -> dict[str, str]:
        env = {
            "TIDE_NATS_URL": self.nats_url,
            "TIDE_NATS_USER": user,
            "TIDE_NATS_PASSWORD": self.passwords[user],
        }
        if self.ha:
            env["TIDE_NATS_STREAM_REPLICAS"] = str(HA_SIZE)
        if user in SERVICES:
            env["TIDE_REDIS_URL"] = self.redis_url(user)
            if self.ha:
                env["TIDE_REDIS_SENTINELS"] = self.redis_sentinels
                env["TIDE_REDIS_MASTER_NAME"] = self.redis_master_name
                env["TIDE_REDIS_SENTINEL_PASSWORD"] = self.passwords[SENTINEL_PASSWORD]
        return env

    def save(self) -> None:
        """Written whole or not at all (a temporary file renamed over it), so a reader never finds it empty or
        half written while the supervisor rewrites it for a restarted process; readable by its owner only (it
        holds the stack's passwords)."""
        path = Path(self.home) / "stack.json"
        tmp = path.with_name(f".stack.json.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(asdict(self), indent=2))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    @classmethod
    def load(cls, home: Path) -> StackInfo:
        path = home / "stack.json"
        if not path.exists():
            raise StackError(f"no stack in {home} (start one with `tide up`, or set TIDE_NATS_URL/USER/PASSWORD)")
        return cls(**json.loads(path.read_text()))


def _alive(pid: int) -> bool:
    """True while the process runs (a zombie nobody reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def pid_alive(pid: int) -> bool:
    return _alive(pid)


def stack_running(home: Path) -> bool:
    try:
        info = StackInfo.load(home)
    except StackError:
        return False
    pids = [*info.pids.values(), *([info.supervisor_pid] if info.supervisor_pid else [])]
    return any(_alive(pid) for pid in pids)


def cluster_nodes(nodes: int, node_file: Path | None) -> list[NodeDescription]:
    if node_file is not None:
        return load_node_file(node_file)
    return [default_h100_node(f"node-{i}") for i in range(nodes)]


class Stack:
    """Starts, supervises and stops the whole stack; one instance per ``tide up``."""

    def __init__(
        self,
        home: Path,
        nodes: list[NodeDescription],
        log_format: str = "json",
        placers: int = 1,
        env: dict[str, dict[str, str]] | None = None,
        start_agents: bool = True,
        supervise: bool = True,
        ha: bool = False,
        tenants: list[Tenant] | None = None,
    ) -> None:
        """``placers`` > 1 runs several placer processes (placer, placer-2, ...) on one cluster;
        ``env`` adds environment variables per process name (e.g. settings for one service);
        ``start_agents=False`` creates the nodes' credentials but leaves running their agents to the caller
        (benchmarks that multiplex simulated agents); ``supervise=False`` restarts nothing; ``ha=True`` runs a
        3-server NATS cluster (streams with 3 replicas) and Redis as primary + replica + 3 Sentinels."""
        self.ha = ha
        self.tenants = {t.name: t for t in tenants or []}
        self.start_agents = start_agents
        self.home = home
        self.nodes = nodes
        self.log_format = log_format
        self.services = ["queue", "metrics", "placer", *[f"placer-{i}" for i in range(2, placers + 1)]]
        self.extra_env = env or {}
        self.supervise = supervise
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.argv: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.health: dict[str, ProcessHealth] = {}
        self.held: set[str] = set()  # stopped on purpose (kill): not restarted until restart()
        self.info: StackInfo | None = None
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    # ------------------------------------------------------------ start
    def start(self, timeout_s: float = 60.0) -> StackInfo:
        if stack_running(self.home):
            raise StackError(f"a stack is already running in {self.home}: `tide down` first")
        for sub in ("logs", "run", "nats", "redis", "agents"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        for ready in (self.home / "run").glob("*.ready"):
            ready.unlink()
        (self.home / STOPPING_FILE).unlink(missing_ok=True)
        node_ids = [n.node_id for n in self.nodes]
        passwords = {name: new_password() for name in (*SERVICES, "admin")}
        passwords.update({node_user(n): new_password() for n in node_ids})
        for name in self.tenants:
            check_tenant_name(name, node_ids)
            passwords[name] = new_password()
        save_tenants(self.home / TENANTS_FILE, self.tenants)
        if self.ha:
            passwords.update({name: new_password() for name in HA_SECRETS})
        nats_names = nats_servers(self.ha)
        ports = {name: free_port() for name in (*nats_names, *redis_servers(self.ha))}
        metrics_port = free_port()
        placer_ports = {name: free_port() for name in self.services if service_user(name) == "placer"}
        node_file = self.home / "nodes.yaml"
        node_file.write_text(yaml.safe_dump(ClusterDescription(nodes=self.nodes).model_dump(mode="json")))
        self.info = info = StackInfo(
            home=str(self.home),
            nats_url=",".join(f"nats://{HOST}:{ports[n]}" for n in nats_names),
            redis_host=HOST,
            redis_port=ports["redis"],
            metrics_url=f"http://{HOST}:{metrics_port}/metrics",
            passwords=passwords,
            node_ids=node_ids,
            ha=self.ha,
            redis_sentinels=",".join(f"{HOST}:{ports[n]}" for n in redis_servers(self.ha) if n.startswith("sentinel")),
            redis_master_name=HA_MASTER_NAME if self.ha else "",
            ports=ports,
            tenants=sorted(self.tenants),
            placer_metrics_urls={name: f"http://{HOST}:{port}/metrics" for name, port in placer_ports.items()},
        )
        write_prometheus_config(self.home / PROMETHEUS_CONFIG, info)
        try:
            if self.ha:
                self._start_ha_servers(info)
            else:
                self._start_servers(info, ports["nats"], ports["redis"])
            base = {"TIDE_LOG_FORMAT": self.log_format}
            for name in self.services:
                user = service_user(name)
                env = {**base, **info.env_for(user), "TIDE_READY_FILE": str(self.home / "run" / f"{name}.ready")}
                if name == "queue":
                    env["TIDE_TENANTS_FILE"] = str(self.home / TENANTS_FILE)
                if name in placer_ports:
                    env["TIDE_PLACER_METRICS_PORT"] = str(placer_ports[name])
                if name == "metrics":
                    env["TIDE_METRICS_PORT"] = str(metrics_port)
                    env["TIDE_HEALTH_FILE"] = str(self.home / HEALTH_FILE)  # tide_process_restarts_total
                env.update(self.extra_env.get(name, {}))
                self._spawn(name, [sys.executable, "-m", SERVICE_MODULES[user]], env)
            self._wait_ready_files(tuple(self.services), timeout_s)
            for node_id in node_ids if self.start_agents else []:
                env = {
                    **base,
                    **info.env_for(node_user(node_id)),
                    "TIDE_NODE_ID": node_id,
                    "TIDE_NODE_FILE": str(node_file),
                    "TIDE_WORK_DIR": str(self.home / "agents"),
                    **self.extra_env.get("agents", {}),  # every agent
                    **self.extra_env.get(f"agent-{node_id}", {}),
                }
                self._spawn(f"agent-{node_id}", [sys.executable, "-m", "tide_node_agent"], env)
            if self.start_agents:
                run_blocking(wait_for_nodes(info, len(node_ids), timeout_s))
        except BaseException:
            self.stop()
            raise
        info.pids = {name: p.pid for name, p in self.procs.items()}
        info.save()
        self._write_health()
        if self.supervise:
            self._supervisor = threading.Thread(target=self._supervise, name="tide-supervisor", daemon=True)
            self._supervisor.start()
        return info

    def _start_servers(self, info: StackInfo, nats_port: int, redis_port: int) -> None:
        conf = self.home / "nats" / "nats.conf"
        monitor = info.monitor_ports["nats"] = free_port()  # /varz, /connz on the loopback (bench/e2e_latency.py)
        conf.write_text(
            nats_config(nats_port, str(self.home / "nats" / "store"), info.passwords, info.node_ids, HOST,
                        tenants=info.tenants)
            + f"http: {json.dumps(f'{HOST}:{monitor}')}\n"
        )
        conf.chmod(0o600)
        self._spawn("nats", [nats_server_binary(), "-c", str(conf)], nats_server_env())
        rconf = self.home / "redis" / "redis.conf"
        rconf.write_text(redis_config(redis_port, str(self.home / "redis"), redis_acl_lines(info.passwords), HOST))
        rconf.chmod(0o600)
        self._spawn("redis", [redis_server_binary(), str(rconf)], {})
        wait_tcp(HOST, nats_port)
        wait_tcp(HOST, redis_port)
        run_blocking(wait_for_jetstream(info, 60.0))  # the streams, once, as admin: the placer and metrics may
        # only look them up (docs/security.md)

    def _start_ha_servers(self, info: StackInfo) -> None:
        """Three clustered NATS servers (each with JetStream), then a Redis primary, its replica and three
        Sentinels; returns once JetStream has a meta leader and every Sentinel sees the replica and the
        other Sentinels (so a failover can happen from the first second)."""
        names = nats_servers(True)
        route_ports = {n: free_port() for n in names}
        for i, name in enumerate(names, start=1):
            info.monitor_ports[name] = free_port()
            cluster = NatsCluster(server_name=f"tide-{i}", route_port=route_ports[name],
                                  peer_route_ports=[route_ports[o] for o in names if o != name],
                                  http_port=info.monitor_ports[name])
            conf = self.home / "nats" / f"{name}.conf"
            conf.write_text(nats_config(info.ports[name], str(self.home / "nats" / f"store-{i}"), info.passwords,
                                        info.node_ids, HOST, cluster=cluster, tenants=info.tenants))
            conf.chmod(0o600)
            self._spawn(name, [nats_server_binary(), "-c", str(conf)], nats_server_env())
        acl = redis_acl_lines(info.passwords, ha=True)
        replication = (REPLICATION_USER, info.passwords[REPLICATION_USER])
        primary = info.ports["redis"]
        for name in ("redis", "redis-replica"):
            data_dir = self.home / name
            data_dir.mkdir(parents=True, exist_ok=True)
            rconf = data_dir / "redis.conf"  # a Sentinel may rewrite it (CONFIG REWRITE after a failover)
            rconf.write_text(redis_config(info.ports[name], str(data_dir), acl, HOST, replication=replication,
                                          replica_of=primary if name != "redis" else None))
            rconf.chmod(0o600)
            self._spawn(name, [redis_server_binary(), str(rconf)], {})
        for name in names:
            wait_tcp(HOST, info.ports[name])
        for name in ("redis", "redis-replica"):
            wait_tcp(HOST, info.ports[name])
        for name in redis_servers(True):
            if name.startswith("sentinel"):
                data_dir = self.home / name
                data_dir.mkdir(parents=True, exist_ok=True)
                sconf = data_dir / "sentinel.conf"
                sconf.write_text(sentinel_config(info.ports[name], str(data_dir), info.redis_master_name, primary,
                                                 info.passwords[SENTINEL_PASSWORD],
                                                 (SENTINEL_USER, info.passwords[SENTINEL_USER]), HOST))
                sconf.chmod(0o600)
                self._spawn(name, [redis_server_binary(), str(sconf), "--sentinel"], {})
        for name in redis_servers(True):
            wait_tcp(HOST, info.ports[name])
        run_blocking(wait_for_jetstream(info, 60.0))
        wait_for_sentinels(info, 60.0)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.argv[name] = (argv, env)
        log_file = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        with self._lock:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **env, STACK_MARKER: str(self.home.resolve())}, start_new_session=True,
            )
            old = self.health.get(name)
            self.health[name] = ProcessHealth(
                name=name, pid=self.procs[name].pid, state="running", started_at=time.time(),
                restarts=old.restarts if old else 0, last_exit=old.last_exit if old else None,
                crashes_in_a_row=old.crashes_in_a_row if old else 0,
            )
        log_file.close()

    def _wait_ready_files(self, names: tuple[str, ...], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for name in names:
            ready = self.home / "run" / f"{name}.ready"
            while not ready.exists():
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise StackError(f"{name} exited with {proc.returncode}; see {self.home}/logs/{name}.log")
                if time.monotonic() > deadline:
                    raise StackError(f"{name} not ready after {timeout_s}s; see {self.home}/logs/{name}.log")
                time.sleep(0.05)

    # ------------------------------------------------------------ supervision
    def _supervise(self) -> None:
        """Restart every process that exits unasked, after its backoff; keep health.json current."""
        last_written = time.monotonic()
        while not self._stopping.wait(SUPERVISE_EVERY_S):
            changed = False
            if (self.home / STOPPING_FILE).exists():
                log.info("supervisor_stopping", reason="tide down")
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                for name, proc in list(self.procs.items()):
                    if name not in self.held:
                        changed = self._check(name, proc, time.time()) or changed
            if changed or time.monotonic() - last_written >= HEALTH_EVERY_S:
                self._write_health()
                last_written = time.monotonic()

    def _check(self, name: str, proc: subprocess.Popen[bytes], now: float) -> bool:
        """One process, under the lock: notice a crash, or restart once the backoff is over. True on a change."""
        h = self.health[name]
        if h.state == "restarting":
            if h.restart_at is not None and now >= h.restart_at:
                self._respawn(name)
                return True
            return False
        code = proc.poll()
        if code is None:
            return False
        h.crashes_in_a_row = crashes_in_a_row(h.crashes_in_a_row, now - (h.started_at or now))
        wait_s = backoff_s(h.crashes_in_a_row)
        h.state, h.last_exit, h.restart_at, h.pid = "restarting", code, now + wait_s, None
        log.warning("process_exited", process=name, exit_code=code, restarts=h.restarts, backoff_s=wait_s)
        return True

    def _respawn(self, name: str) -> None:
        argv, env = self.argv[name]
        if name in self.services:
            (self.home / "run" / f"{name}.ready").unlink(missing_ok=True)
        old = self.health[name]
        old.restarts += 1
        self._spawn(name, argv, env)
        h = self.health[name]
        log.warning("process_restarted", process=name, exit_code=h.last_exit, restarts=h.restarts, pid=h.pid,
                    backoff_s=backoff_s(h.crashes_in_a_row))
        self._save_pids()

    def _save_pids(self) -> None:
        if self.info is not None and (Path(self.info.home) / "stack.json").exists():
            self.info.pids = {n: p.pid for n, p in self.procs.items()}
            self.info.save()

    def _write_health(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            rows = [ProcessHealth(**vars(h)) for h in self.health.values()]
        write_health(self.home, health_document(rows, os.getpid(), time.time()))

    def restarts(self, name: str) -> int:
        """How often the supervisor restarted this process."""
        with self._lock:
            return self.health[name].restarts

    # ------------------------------------------------------------ one part
    def kill(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int:
        """Stop one process on purpose (e.g. to test a crash) and wait for it to exit; returns its exit code.
        The supervisor leaves it stopped until ``restart``."""
        with self._lock:
            self.held.add(name)
            self.health[name].state = "stopped"
            proc = self.procs[name]
        proc.send_signal(sig)
        code = proc.wait(timeout=timeout_s)
        with self._lock:
            self.health[name].last_exit = code
        return code

    def restart(self, name: str, timeout_s: float = 30.0, env: dict[str, str] | None = None) -> None:
        """Start a stopped process again with the same command and environment (plus ``env``)."""
        argv, old_env = self.argv[name]
        if name in self.services:
            (self.home / "run" / f"{name}.ready").unlink(missing_ok=True)
        with self._lock:
            self._spawn(name, argv, {**old_env, **(env or {})})
            self.held.discard(name)
        if name in self.services:
            self._wait_ready_files((name,), timeout_s)
        elif self.info is not None and name in self.info.ports:
            wait_tcp(HOST, self.info.ports[name], timeout_s)
        elif name in ("nats", "redis") and self.info is not None:  # a stack.json from before `ports`
            port = int(self.info.nats_url.rsplit(":", 1)[1]) if name == "nats" else self.info.redis_port
            wait_tcp(HOST, port, timeout_s)
        self._save_pids()

    # ------------------------------------------------------------ stop
    def stop(self) -> list[str]:
        """Stop the supervisor, then every process (restarted ones included); returns their names."""
        self._stopping.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=10)
        with self._lock:
            pids = {name: p.pid for name, p in self.procs.items()}
        stopped = stop_pids(pids)
        for p in self.procs.values():
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        stopped += [f"stray pid {pid}" for pid in stop_marked(self.home)]
        for name in ("stack.json", HEALTH_FILE):
            (self.home / name).unlink(missing_ok=True)
        return stopped


def add_tenant(home: Path, tenant: Tenant) -> str:
    """Add (or change the policy of) a tenant of the running stack in ``home``: its NATS user (a new password,
    or the one it has), its policy in the tenants file the queue reads, every NATS server's config rewritten
    and reloaded (SIGHUP). Returns the tenant's password."""
    info = StackInfo.load(home)
    check_tenant_name(tenant.name, info.node_ids)
    tenants = load_tenants(home / TENANTS_FILE)
    tenants[tenant.name] = tenant
    info.passwords.setdefault(tenant.name, new_password())
    info.tenants = sorted({*info.tenants, tenant.name})
    block = users_block(info.passwords, info.node_ids, info.tenants)
    confs = sorted((home / "nats").glob("nats*.conf"))
    if not confs:
        raise StackError(f"no NATS config in {home / 'nats'}")
    for conf in confs:
        tmp = conf.with_suffix(".tmp")
        tmp.write_text(replace_users(conf.read_text(), block))
        tmp.chmod(0o600)
        tmp.replace(conf)
    info.save()
    save_tenants(home / TENANTS_FILE, tenants)
    for name in nats_servers(info.ha):
        pid = info.pids.get(name)
        if pid and _alive(pid):
            os.kill(pid, signal.SIGHUP)  # nats-server reloads its config (users and permissions)
    return info.passwords[tenant.name]


def run_blocking(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to completion from synchronous code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, coro).result()


PROMETHEUS_CONFIG = "prometheus.yml"


def prometheus_config(info: StackInfo, scrape_interval: str = "5s") -> dict[str, Any]:
    """A Prometheus scrape config for the stack: the metrics service and every placer (each its own /metrics)."""
    def targets(*urls: str) -> list[dict[str, list[str]]]:
        return [{"targets": [urlparse(u).netloc for u in urls]}]

    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {"job_name": "tide-metrics", "static_configs": targets(info.metrics_url)},
            {"job_name": "tide-placer", "static_configs": targets(*info.placer_metrics_urls.values())},
        ],
    }


def write_prometheus_config(path: Path, info: StackInfo) -> None:
    """``$TIDE_HOME/prometheus.yml``: ``prometheus --config.file=...`` scrapes this stack (ports change per start)."""
    path.write_text(yaml.safe_dump(prometheus_config(info), sort_keys=False))


def nats_servers(ha: bool) -> list[str]:
    """The NATS server processes: ``nats`` alone, or ``nats``, ``nats-2``, ``nats-3``."""
    return ["nats", *[f"nats-{i}" for i in range(2, HA_SIZE + 1)]] if ha else ["nats"]


def redis_servers(ha: bool) -> list[str]:
    """The Redis processes: ``redis`` alone, or the first primary ``redis``, ``redis-replica`` and the Sentinels."""
    if not ha:
        return ["redis"]
    return ["redis", "redis-replica", *[f"sentinel-{i}" for i in range(1, HA_SIZE + 1)]]


def service_user(name: str) -> str:
    """The credentials a process uses: extra placers (placer-2, ...) are the placer."""
    return name.split("-", 1)[0] if name.startswith("placer-") else name


def stop_pids(pids: dict[str, int], grace_s: float = 10.0) -> list[str]:
    """Stop agents and services first (they drain), then Redis and NATS: SIGTERM, ``grace_s``, then SIGKILL
    to the process group. Returns the names of those that were running."""
    running = [n for n in pids if _alive(pids[n])]
    servers = [n for n in pids if n.startswith(SERVER_PREFIXES)]
    agents = [n for n in pids if n.startswith("agent-")]
    others = [n for n in pids if n not in servers and n not in agents]
    for group in (agents + others, servers):
        for name in group:
            _signal(pids[name], signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name in group:
            while _alive(pids[name]) and not _reaped(pids[name]) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pids[name]) and not _reaped(pids[name]):
                _signal(pids[name], signal.SIGKILL, group=True)
    return running


def _signal(pid: int, sig: int, group: bool = False) -> None:
    try:
        if group and os.getpgid(pid) == pid:  # started in its own session: its group is its own
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reaped(pid: int) -> bool:
    """Reap a child of ours if it has exited (True when it is gone)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return not _alive(pid)


def marked_pids(home: Path) -> list[int]:
    """Processes whose environment says they belong to the stack in ``home`` (Linux /proc)."""
    needle = f"{STACK_MARKER}={home.resolve()}".encode()
    found: list[int] = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and _alive(pid):
            found.append(pid)
    return found


def stop_marked(home: Path, grace_s: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process still marked as part of this stack; returns their pids."""
    pids = marked_pids(home)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(p) and not _reaped(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    return pids


def down(home: Path, timeout_s: float = 60.0) -> list[str] | None:
    """Stop the stack in ``home``: tell any supervisor to restart nothing more, stop the supervising
    `tide up` (which stops what it runs), then every process recorded in stack.json and health.json that
    still runs, then any process marked with the stack's home (pods included). Returns what was stopped,
    or None when there was no stack."""
    if not (home / "stack.json").exists() and read_health(home) is None and not marked_pids(home):
        return None
    (home / STOPPING_FILE).write_text(f"{os.getpid()}\n")
    time.sleep(3 * SUPERVISE_EVERY_S)  # a supervisor thread finishes the restart it may be in the middle of
    try:
        info: StackInfo | None = StackInfo.load(home)
    except (StackError, ValueError, TypeError):
        info = None
    recorded: dict[str, int] = dict(info.pids) if info else {}
    for p in (read_health(home) or {}).get("processes", []):
        if p.get("pid"):
            recorded[p["name"]] = p["pid"]
    stopped: list[str] = []
    supervisor = info.supervisor_pid if info else None
    if supervisor and supervisor != os.getpid() and _alive(supervisor):
        stopped += [f"supervisor (pid {supervisor})", *[n for n, pid in recorded.items() if _alive(pid)]]
        _signal(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(supervisor):
            _signal(supervisor, signal.SIGKILL)
    leftover = {n: pid for n, pid in recorded.items() if _alive(pid)}
    stopped += [n for n in stop_pids(leftover) if n not in stopped]
    stopped += [f"stray pid {pid}" for pid in stop_marked(home)]
    for name in ("stack.json", HEALTH_FILE, STOPPING_FILE):
        (home / name).unlink(missing_ok=True)
    return stopped


async def wait_for_jetstream(info: StackInfo, timeout_s: float) -> None:
    """A NATS cluster answers JetStream requests once it has elected a meta leader; then create the streams
    with their replicas."""
    nc = await connect(info.settings_for("admin"), "tide-up")
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await js.account_info()
                await ensure_streams(js, HA_SIZE if info.ha else 1)  # once here, not three services at once
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise StackError(f"no JetStream meta leader in the NATS cluster after {timeout_s}s: {exc}") from exc
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


def sentinel_view(host: str, port: int, password: str, master_name: str) -> dict[str, Any]:
    """What one Sentinel says about the master (``SENTINEL MASTER``), as a dict of strings."""
    import redis  # sync client: used from the launcher's thread

    client = redis.Redis(host=host, port=port, password=password, socket_timeout=1, socket_connect_timeout=1,
                         decode_responses=True)
    try:
        return dict(client.execute_command("SENTINEL", "MASTER", master_name))
    finally:
        client.close()


def wait_for_sentinels(info: StackInfo, timeout_s: float) -> None:
    """Every Sentinel knows the replica and the two other Sentinels (both are learnt, not configured)."""
    deadline = time.monotonic() + timeout_s
    for name in (n for n in info.ports if n.startswith("sentinel")):
        while True:
            view: dict[str, Any] = {}
            try:
                view = sentinel_view(HOST, info.ports[name], info.passwords[SENTINEL_PASSWORD],
                                     info.redis_master_name)
                if int(view.get("num-slaves", 0)) >= 1 and int(view.get("num-other-sentinels", 0)) >= HA_SIZE - 1:
                    break
            except Exception as exc:
                view = {"error": repr(exc)}
            if time.monotonic() > deadline:
                raise StackError(f"{name} does not see the replica and the other Sentinels after {timeout_s}s: {view}")
            time.sleep(0.1)


async def wait_for_nodes(info: StackInfo, count: int, timeout_s: float) -> None:
    """Ready means: the placer knows every node agent."""
    nc = await connect(info.settings_for("admin"), "tide-up")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = await nc.request(subjects.API_NODES, b"{}", timeout=2)
                if len(json.loads(reply.data)["nodes"]) >= count:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise StackError(f"not all {count} node agents registered after {timeout_s}s")
            await asyncio.sleep(0.1)
    finally:
        await nc.close()
