"""The ``tide`` command line. Exit codes: 0 success, 1 failure, 2 bad input (with a one-line reason).

A service that does not answer is one line on stderr and exit 1, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nats.errors
import yaml

from tide.cli import describe as describing
from tide.cli import logs as pod_logs
from tide.cli.completion import completion_script
from tide.cli.inline import InlineError, describe_error, first_error, inline_spec
from tide.cli.output import FORMATS, dump, filter_jobs, job_row, jobs_table, nodes_wide, table
from tide.client import TENANT_NO_WATCH, NodeNotAnswering, ServiceUnavailable, TideClient, summarize
from tide.log import configure_logging
from tide.schemas.events import TERMINAL_STATES
from tide.schemas.job import PriorityClass, job_spec_json_schema
from tide.settings import Settings
from tide.stack.auth import Tenant, check_tenant_name
from tide.stack.launcher import (
    Stack,
    StackInfo,
    add_tenant,
    cluster_nodes,
    default_home,
    down,
    pid_alive,
    stack_running,
)
from tide.stack.servers import StackError
from tide.stack.supervision import format_uptime, health_rows, read_health

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
FINISHED = {s.value for s in TERMINAL_STATES}
EXIT_CODES = """exit codes:
  0  success (also: `tide cancel` of a job that has already finished: nothing to cancel)
  1  failure: job failed/cancelled/unschedulable with --wait, unknown job, a service not answering,
     `tide health` with a process down, stack error
  2  bad input, with a one-line reason"""


class BadInput(Exception):
    pass


class Rejected(BadInput):
    """A spec built from flags that does not validate: printed as the queue's rejections are."""


def client_settings(home: Path, user: str | None = None) -> Settings:
    """The admin's settings, or with ``user`` (``--user`` / TIDE_USER) that tenant's credentials from stack.json.
    With TIDE_NATS_URL set, everything comes from the environment (TIDE_NATS_USER/PASSWORD, TIDE_USER)."""
    if os.environ.get("TIDE_NATS_URL"):
        return Settings(**({"user": user} if user else {}))
    info = StackInfo.load(home)
    if not user:
        return info.settings_for("admin")
    if user not in info.tenants:
        raise BadInput(f"no tenant {user!r} in the stack in {home} (`tide user add {user} --queues ...`)")
    return info.settings_for(user)


def load_tenant_file(path: str) -> list[Tenant]:
    """``{tenants: [{name, queues, max_priority, max_pending}]}`` (YAML/JSON) for `tide up --tenants`."""
    data = load_spec(path)
    rows = data.get("tenants") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise BadInput(f"{path}: expected {{tenants: [{{name, queues, max_priority}}, ...]}}")
    try:
        return [tenant_from(**row) for row in rows]
    except TypeError as exc:
        raise BadInput(f"{path}: {exc}") from exc


def tenant_from(name: str, queues: list[str] | str, max_priority: str = "offline-training",
                max_pending: int | None = None) -> Tenant:
    queue_list = split_csv([queues]) if isinstance(queues, str) else [str(q) for q in queues]
    if not queue_list:
        raise BadInput(f"tenant {name!r}: at least one queue")
    if max_priority not in {p.value for p in PriorityClass}:
        raise BadInput(f"tenant {name!r}: max priority {max_priority!r} is not one of "
                       f"{', '.join(p.value for p in PriorityClass)}")
    try:
        check_tenant_name(name)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    return Tenant(name=name, queues=queue_list, max_priority=max_priority, max_pending=max_pending)


def cmd_user_add(args: argparse.Namespace) -> int:
    tenant = tenant_from(args.name, args.queues, args.max_priority, args.max_pending)
    home: Path = args.home.resolve()
    try:
        add_tenant(home, tenant)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    print(f"tenant {tenant.name}: queues {', '.join(tenant.queues)}, up to {tenant.max_priority}; "
          f"use it with `tide --user {tenant.name} ...` or TIDE_USER={tenant.name} (password in {home}/stack.json)")
    return EXIT_OK


def load_spec(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror}") from exc
    try:
        if path.endswith(".json"):
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.endswith(".json") else "YAML"
        raise BadInput(f"{path}: malformed {kind}: {str(exc).splitlines()[0]}") from exc


# ---------------------------------------------------------------- commands
def cmd_up(args: argparse.Namespace) -> int:
    home: Path = args.home.resolve()
    if args.detach:
        return up_detached(args, home)
    nodes = cluster_nodes(args.nodes, Path(args.node_file) if args.node_file else None)
    env = {"queue": {"TIDE_QUEUE_CONFIG": str(Path(args.queue_config).resolve())}} if args.queue_config else {}
    tenants = load_tenant_file(args.tenants) if args.tenants else None
    stack = Stack(home, nodes, env=env, ha=args.ha, tenants=tenants)
    print(f"starting Tide in {home} with {len(nodes)} simulated node(s)...", flush=True)
    info = stack.start()
    print_endpoints(info, len(nodes))
    if args.demo:
        try:
            return asyncio.run(run_demo(info.settings_for("admin")))
        finally:
            stack.stop()
            print("stack stopped")
    info.supervisor_pid = os.getpid()  # `tide down` asks this process to stop the stack
    info.save()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _sig, _frame: stop.set())
    print("ready (supervised: crashed processes are restarted): Ctrl-C or `tide down` stops the stack", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        stopped = stack.stop()
        print(f"stack stopped: {', '.join(stopped)}", flush=True)
    return EXIT_OK


def print_endpoints(info: StackInfo, nodes: int) -> None:
    print(f"  NATS (JetStream)  {info.nats_url}")
    print(f"  Redis             redis://{info.redis_host}:{info.redis_port}")
    if info.ha:
        print(f"  Sentinels         {info.redis_sentinels} (master {info.redis_master_name}; docs/ha.md)")
    print(f"  metrics           {info.metrics_url}")
    for name, url in info.placer_metrics_urls.items():
        print(f"  {name + ' metrics':<17} {url}")
    print(f"  prometheus config {info.home}/prometheus.yml (scrapes both)")
    print(f"  services          queue placer metrics ({nodes} node agents)")
    print(f"  logs              {info.home}/logs   credentials {info.home}/stack.json   health {info.home}/health.json")


def up_detached(args: argparse.Namespace, home: Path, timeout_s: float = 180.0) -> int:
    """Run the supervising `tide up` in the background (its own session, output in logs/supervisor.log)
    and return once it reports the stack ready."""
    if stack_running(home):
        raise StackError(f"a stack is already running in {home}: `tide down` first")
    (home / "logs").mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "tide.cli.main", "--home", str(home), "up", "--nodes", str(args.nodes)]
    if args.node_file:
        argv += ["--node-file", str(Path(args.node_file).resolve())]
    if args.queue_config:
        argv += ["--queue-config", str(Path(args.queue_config).resolve())]
    if args.tenants:
        argv += ["--tenants", str(Path(args.tenants).resolve())]
    if args.ha:
        argv.append("--ha")
    log_path = home / "logs" / "supervisor.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    print(f"starting Tide in {home} (supervisor pid {proc.pid}, log {log_path})...", flush=True)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise StackError(f"the stack did not start (exit {proc.returncode}): {tail[0]}")
        try:
            info = StackInfo.load(home)
        except (StackError, ValueError, TypeError):
            info = None
        if info is not None and info.supervisor_pid == proc.pid:
            break
        if time.monotonic() > deadline:
            raise StackError(f"the stack is not ready after {timeout_s:g}s; see {log_path}")
        time.sleep(0.1)
    print_endpoints(info, len(info.node_ids))
    print("ready (detached, supervised): `tide health` shows the processes, `tide down` stops them")
    return EXIT_OK


def demo_jobs() -> list[dict[str, Any]]:
    script = (
        "import os, time; "
        "print('pod', os.environ['TIDE_POD_NAME'], 'GPUs', os.environ['CUDA_VISIBLE_DEVICES'], "
        "'SM%', os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '-')); time.sleep(1)"
    )
    command = [sys.executable, "-c", script]
    return [
        {"metadata": {"name": "demo-single"}, "spec": {"template": {"command": command, "resources": {"gpu": 1}}}},
        {
            "metadata": {"name": "demo-share", "priorityClass": "online-serving"},
            "spec": {"template": {"command": command,
                                  "resources": {"gpuShare": {"memoryMiB": 10240, "smPercent": 30}}}},
        },
        {
            "metadata": {"name": "demo-gang"},
            "spec": {"replicas": 4, "minMember": 4, "template": {"command": command, "resources": {"gpu": 2}}},
        },
    ]


async def run_demo(settings: Settings) -> int:
    client = await TideClient.connect(settings)
    try:
        results = []
        for spec in demo_jobs():
            res = await client.submit(spec)
            print(f"submitted {res.job_id}: {'queued' if res.accepted else 'rejected: ' + res.reason}")
            results.append(res)
        ok = True
        for res in results:
            job = await client.wait(res.job_id, timeout_s=120)
            pods = ", ".join(f"{p['name']}@{p['node']}[{len(p['gpus'])} GPU]" for p in job["pods"])
            print(f"{job['job_id']}: {job['state']} {job['reason']}  {pods}")
            ok = ok and job["state"] == "succeeded"
        print("demo passed" if ok else "demo FAILED")
        return EXIT_OK if ok else EXIT_FAIL
    finally:
        await client.close()


def cmd_down(args: argparse.Namespace) -> int:
    stopped = down(args.home)
    if stopped is None:
        print(f"no stack running in {args.home}", file=sys.stderr)
        return EXIT_FAIL
    if stopped:
        print(f"stopped the stack in {args.home}: {', '.join(stopped)}")
    else:
        print(f"nothing was running in {args.home} (cleared its state)")
    return EXIT_OK


def cmd_health(args: argparse.Namespace) -> int:
    document = read_health(args.home)
    if document is None:
        print(f"tide: no supervised stack in {args.home} (no health.json; start one with `tide up`)",
              file=sys.stderr)
        return EXIT_FAIL
    pids = [p["pid"] for p in document.get("processes", []) if p.get("pid")]
    rows, healthy = health_rows(document, {pid: pid_alive(pid) for pid in pids}, time.time())
    if args.json:
        print(json.dumps({"healthy": healthy, "processes": [vars(r) for r in rows]}))
    else:
        print(f"{'PROCESS':<20} {'STATE':<13} {'PID':>8} {'UPTIME':>8} {'RESTARTS':>8}  LAST EXIT")
        for r in rows:
            last = "-" if r.last_exit is None else str(r.last_exit)
            uptime = format_uptime(r.uptime_s)
            print(f"{r.name:<20} {r.state:<13} {r.pid or '-':>8} {uptime:>8} {r.restarts:>8}  {last}")
    return EXIT_OK if healthy else EXIT_FAIL


async def _with_client(args: argparse.Namespace, fn: Any) -> int:
    client = await TideClient.connect(client_settings(args.home, args.user))
    try:
        return await fn(client)
    finally:
        await client.close()


def submitted_spec(args: argparse.Namespace) -> Any:
    """The spec from FILE, or built from the flags and the command after `--` (validated here first)."""
    command = args.wrapped
    inline_flags = [f for f in INLINE_FLAGS if getattr(args, f) not in (None, [])]
    if args.file is not None:
        if command is not None or inline_flags:
            used = "`-- COMMAND`" if command is not None else f"--{inline_flags[0].replace('_', '-')}"
            raise BadInput(f"submit takes a spec FILE or flags with `-- COMMAND`, not both ({used} given with "
                           f"{args.file})")
        return load_spec(args.file)
    if command is None:
        raise BadInput("submit needs a spec FILE, or flags and a command after `--` "
                       "(e.g. tide submit --gpus 1 -- python train.py)")
    try:
        spec = inline_spec(args, command)
    except InlineError as exc:
        raise BadInput(str(exc)) from exc
    error = first_error(spec)
    if error is not None:
        raise Rejected(describe_error(*error))
    return spec


INLINE_FLAGS = ("gpus", "replicas", "min_member", "queue", "priority", "share_mem", "share_sm", "mig", "name",
                "gpu_model", "cpu", "memory", "image", "env", "selector")


def cmd_submit(args: argparse.Namespace) -> int:
    spec = submitted_spec(args)

    async def go(client: TideClient) -> int:
        res = await client.submit(spec, job_id=args.job_id)
        if not res.accepted:
            field = res.field.removeprefix("spec.")
            if args.json:
                print(json.dumps({"job_id": res.job_id, "state": "rejected", "field": field, "reason": res.reason}))
            print(f"rejected: {field}: {res.reason}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not args.wait:
            print(json.dumps({"job_id": res.job_id, "state": "pending"}) if args.json else res.job_id)
            return EXIT_OK
        job = await client.wait(res.job_id, timeout_s=args.timeout)
        print(json.dumps(job) if args.json else f"{job['job_id']} {job['state']} {job['reason']}".rstrip())
        return EXIT_OK if job["state"] == "succeeded" else EXIT_FAIL

    return asyncio.run(_with_client(args, go))


def cmd_status(args: argparse.Namespace) -> int:
    if args.services:
        return cmd_health(args)

    async def go(client: TideClient) -> int:
        if args.job:
            job = await client.job(args.job)
            if job is None:
                print(f"no job {args.job!r}", file=sys.stderr)
                return EXIT_FAIL
            if job.get("family"):
                found = (await client.weights(job["family"], limit=1))["families"]
                job["feedback"] = found[0] if found else None
            fmt = output_format(args)
            if fmt in ("json", "yaml"):
                print(dump(job, fmt))
            else:
                print(f"{job['job_id']}  {job['state']}  {job['reason']}")
                for p in job["pods"]:
                    print(f"  {p['name']:<32} {p['state']:<10} {p['node'] or '-':<16} {','.join(p['gpus']) or '-'}")
                fb = job.get("feedback")
                if fb:
                    print(f"  family: {fb['family']} (memory x{fb['memory_multiplier']:g}, affinity "
                          f"{fb['affinity']:g}){' prefers one node' if fb['affinity'] >= 1 else ''}: {fb['evidence']}")
            return EXIT_OK
        body = await client.status(limit=args.limit)
        now = time.time()
        rows = filter_jobs([job_row(r, summarize(r), now) for r in body.get("jobs", [])],
                           split_csv(args.state), split_csv(args.queue))
        fmt = output_format(args)
        if fmt in ("json", "yaml"):
            print(dump(rows, fmt))
            return EXIT_OK
        print(jobs_table(rows, wide=fmt == "wide"))
        if args.state or args.queue:
            return EXIT_OK
        families = (await client.weights())["families"]
        if families:
            print(f"\nFeedback\n{'FAMILY':<24} {'MEMORY x':>8} {'AFFINITY':>8} {'CLEAN':>5}  LAST CHANGE")
            for f in families:
                near = " (prefers one node)" if f["affinity"] >= 1 else ""
                print(f"{f['family']:<24} {f['memory_multiplier']:>8g} {f['affinity']:>8g} {f['clean_runs']:>5}  "
                      f"{f['evidence']}{near}")
        return EXIT_OK

    return asyncio.run(_with_client(args, go))


def cmd_cancel(args: argparse.Namespace) -> int:
    async def go(client: TideClient) -> int:
        job = await client.job(args.job)
        if job is None:
            print(f"no job {args.job!r}", file=sys.stderr)
            return EXIT_FAIL
        if job["state"] in FINISHED:
            print(f"job {args.job} already {job['state']}; nothing to cancel")
            return EXIT_OK
        await client.cancel(args.job)
        if args.wait:
            job = await client.wait(args.job, timeout_s=args.timeout)
            print(f"{args.job} {job['state']}")
        else:
            print(f"cancel requested for {args.job}")
        return EXIT_OK

    return asyncio.run(_with_client(args, go))


def cmd_nodes(args: argparse.Namespace) -> int:
    async def go(client: TideClient) -> int:
        nodes = await client.nodes()
        fmt = output_format(args)
        if fmt in ("json", "yaml"):
            print(dump(nodes, fmt))
            return EXIT_OK
        if fmt == "wide":
            print(nodes_wide(nodes))
            return EXIT_OK
        print(f"{'NODE':<20} {'POOL':<10} {'RACK':<8} {'GPUS':<6} {'USED':<6} {'MODELS':<20} {'LOST':<5} SEEN")
        for n in nodes:
            used = n["gpus_used_milli"] / 1000
            seen = f"{n['last_seen_s']}s ago" if n["last_seen_s"] is not None else "-"
            print(f"{n['node_id']:<20} {n['labels'].get('pool', '-'):<10} {n['rack']:<8} {n['gpus']:<6} "
                  f"{used:<6.2f} {','.join(n['gpu_models']):<20} {'yes' if n.get('lost') else 'no':<5} {seen}")
        return EXIT_OK

    return asyncio.run(_with_client(args, go))


def cmd_queues(args: argparse.Namespace) -> int:
    config = load_spec(args.apply) if args.apply else None

    async def go(client: TideClient) -> int:
        if config is not None:
            result = await client.apply_queues(config)
            if not result["ok"]:
                print(f"rejected: {result['error']}", file=sys.stderr)
                return EXIT_BAD_INPUT
            print(f"applied: {', '.join(result['queues'])}")
            return EXIT_OK
        queues = await client.queues()
        fmt = output_format(args)
        if fmt in ("json", "yaml"):
            print(dump(queues, fmt))
            return EXIT_OK
        if fmt == "wide":
            print(table(["QUEUE", "WEIGHT", "GUARANTEE", "LIMIT", "GPUS IN USE", "PENDING", "UNSCHEDULABLE",
                         "PREEMPTED", "RUNNING", "DONE", "FAILED"],
                        [[name, f"{c['weight']:g}", _resources(c["guarantee"]), _resources(c["limit"]),
                          f"{c['gpus_in_use']:g}", c["pending"], c["unschedulable"], c["preempted"], c["running"],
                          c["succeeded"], c["failed"]] for name, c in sorted(queues.items())]))
            return EXIT_OK
        print(f"{'QUEUE':<24} {'WEIGHT':>6} {'GUAR.GPU':>8} {'LIMIT.GPU':>9} {'IN USE':>7} {'PENDING':>8} "
              f"{'RUNNING':>8} {'DONE':>6} {'FAILED':>6}")
        for name, c in sorted(queues.items()):
            print(f"{name:<24} {c['weight']:>6g} {c['guarantee'].get('gpu', '-'):>8} {c['limit'].get('gpu', '-'):>9} "
                  f"{c['gpus_in_use']:>7g} {c['pending'] + c['unschedulable'] + c['preempted']:>8} "
                  f"{c['running']:>8} {c['succeeded']:>6} {c['failed']:>6}")
        return EXIT_OK

    return asyncio.run(_with_client(args, go))


def _resources(amounts: dict[str, Any]) -> str:
    return ",".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}" for k, v in amounts.items()) or "-"


def split_csv(values: list[str] | None) -> list[str]:
    return [v for item in values or [] for v in item.split(",") if v]


def output_format(args: argparse.Namespace) -> str:
    return "json" if getattr(args, "json", False) else (getattr(args, "output", None) or "table")


def cmd_logs(args: argparse.Namespace) -> int:
    async def go(client: TideClient) -> int:
        try:
            return await pod_logs.run(client, args.job, args.pod, args.follow, args.attempt, args.tail)
        except (pod_logs.LogsError, NodeNotAnswering) as exc:
            sys.stdout.flush()
            print(f"tide: {exc}", file=sys.stderr)
            return EXIT_FAIL

    try:
        return asyncio.run(_with_client(args, go))
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_describe(args: argparse.Namespace) -> int:
    async def go(client: TideClient) -> int:
        body = await client.status(args.job)
        if body.get("jobs"):
            record = body["jobs"][0]
        elif body.get("rejected"):
            r = body["rejected"]
            record = {"job_id": args.job, "state": "rejected", "reason": f"{r['field']}: {r['reason']}", "pods": []}
        else:
            print(f"no job {args.job!r}", file=sys.stderr)
            letters = await client.dead_letters(args.job)  # a message naming it that no handler could take
            if letters:
                print("\n".join(describing.dead_letter_lines(letters)))
            return EXIT_FAIL
        events = await client.job_history(args.job)
        letters = await client.dead_letters(args.job)
        links: dict[str, str] = {}
        for key, other in describing.related_ids(args.job).items():
            if await client.job(other) is not None:
                links[key] = other
        rows = describing.timeline(events, record, links)
        code = describing.reason_code("", record["state"], record.get("reason", ""))
        fmt = args.output or "table"
        if fmt in ("json", "yaml"):
            print(dump({"job": record, "code": code, "links": links,
                        "events": [{"ts": r.ts, "code": r.code, "text": r.text} for r in rows],
                        "dead_letters": describing.dead_letter_dicts(letters)}, fmt))
        else:
            spec = yaml.safe_dump(describing.compact(record["spec"]), sort_keys=False) if "spec" in record else ""
            print(describing.render(record, rows, links, spec, letters))
        return EXIT_OK

    return asyncio.run(_with_client(args, go))


def cmd_completion(args: argparse.Namespace) -> int:
    print(completion_script(build_parser(), args.shell))
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(job_spec_json_schema(), indent=2))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    if args.user:
        raise BadInput(TENANT_NO_WATCH)

    async def go(client: TideClient) -> int:
        async for e in client.events():
            where = f" pod={e.pod}" if e.pod else ""
            where += f" node={e.node}" if e.node else ""
            print(f"{e.job_id:<36} {e.kind:<14} {e.state.value:<12}{where} {e.reason}".rstrip(), flush=True)
        return EXIT_OK

    try:
        return asyncio.run(_with_client(args, go))
    except KeyboardInterrupt:
        return EXIT_OK


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tide", description="Tide: a scheduler for AI containers on GPU clusters",
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--home", type=Path, default=default_home(), help="stack state dir (default $TIDE_HOME or ~/.tide)"
    )
    parser.add_argument("--user", default=os.environ.get("TIDE_USER") or None,
                        help="act as this tenant (default $TIDE_USER; none: the admin)")
    parser.add_argument("--version", action="version", version=f"tide {tide_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run NATS, Redis, the services and simulated node agents")
    up.add_argument("--nodes", type=int, default=2, help="simulated 8 x H100 nodes (default 2)")
    up.add_argument("--node-file", help="YAML/JSON node descriptions instead of --nodes")
    up.add_argument("--queue-config", help="YAML/JSON queue tree (quotas, weights); see docs/scheduling.md")
    up.add_argument("--ha", action="store_true",
                    help="high availability: 3 clustered NATS servers, Redis primary + replica + 3 Sentinels "
                         "(docs/ha.md)")
    up.add_argument("--tenants", help="YAML/JSON {tenants: [{name, queues, max_priority}]} (docs/security.md)")
    mode = up.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true",
                      help="return once every part is ready (a background supervisor keeps the stack running)")
    mode.add_argument("--demo", action="store_true", help="run the demo jobs to completion, then stop")
    up.set_defaults(fn=cmd_up)

    usr = sub.add_parser("user", help="tenants of the running stack (docs/security.md)")
    usr_sub = usr.add_subparsers(dest="user_command", required=True)
    ua = usr_sub.add_parser("add", help="add a tenant (or change its policy): its own NATS user and password")
    ua.add_argument("name")
    ua.add_argument("--queues", required=True, help="comma-separated queues it may submit to (and sub-queues)")
    ua.add_argument("--max-priority", default="offline-training",
                    help="highest priority class it may use (default offline-training)")
    ua.add_argument("--max-pending", type=int, help="its pending jobs at most (default TIDE_MAX_PENDING_PER_TENANT)")
    ua.set_defaults(fn=cmd_user_add)

    sub.add_parser("down", help="stop the stack and every process it started (restarted ones too)").set_defaults(
        fn=cmd_down)

    h = sub.add_parser("health", help="each process of the stack: state, uptime, restarts; exit 1 if any is down")
    h.add_argument("--json", action="store_true")
    h.set_defaults(fn=cmd_health)

    s = sub.add_parser(
        "submit", help="submit a job spec (YAML or JSON; - for stdin), or a command: [flags] -- COMMAND...",
        usage="tide submit FILE [--wait] [--json] [--job-id ID]\n"
              "       tide submit [--gpus N] [--replicas N] [--queue Q] [--priority CLASS] [--share-mem 10Gi "
              "--share-sm 30] [--mig 1g.10gb] [--name N] [--wait] -- COMMAND [ARGS...]",
        description="Submit a job: a spec file, or (like `sbatch --wrap` / `kubectl run`) a command after `--` "
                    "with its resources as flags. Both build the same validated spec (docs/jobspec.md).")
    s.add_argument("file", nargs="?", help="the job spec (YAML, or JSON when it ends in .json; - for stdin)")
    s.add_argument("--wait", action="store_true", help="wait until the job ends")
    s.add_argument("--json", action="store_true")
    s.add_argument("--job-id", help="choose the job id (default: name + random suffix)")
    s.add_argument("--timeout", type=float, default=3600)
    inline = s.add_argument_group("a command instead of a FILE (after `--`)")
    inline.add_argument("--gpus", type=int, help="whole GPUs per pod")
    inline.add_argument("--replicas", type=int, help="pods (default 1)")
    inline.add_argument("--min-member", type=int, help="gang size (default: replicas)")
    inline.add_argument("--queue", help="queue path (default: default)")
    inline.add_argument("--priority", help="priority class: online-serving, offline-training, best-effort")
    inline.add_argument("--share-mem", help="a GPU share: its GPU memory (10Gi, 512Mi; a plain number is MiB)")
    inline.add_argument("--share-sm", type=int, help="a GPU share: percent of the GPU's SMs (default 100)")
    inline.add_argument("--mig", help="a MIG instance, e.g. 1g.10gb")
    inline.add_argument("--gpu-model", action="append", help="allowed GPU models (repeat or comma-separate)")
    inline.add_argument("--cpu", help="CPU per pod, Kubernetes quantity (16, 500m)")
    inline.add_argument("--memory", help="memory per pod, Kubernetes quantity (64Gi)")
    inline.add_argument("--image", help="container image (agents with a container runtime)")
    inline.add_argument("--env", action="append", metavar="KEY=VALUE", help="environment variable (repeat)")
    inline.add_argument("--selector", action="append", metavar="LABEL=VALUE", help="node selector (repeat)")
    inline.add_argument("--name", help="job name (default: from the command)")
    s.set_defaults(fn=cmd_submit, wrapped=None)

    st = sub.add_parser("status", help="a job's state and pods, or recent jobs")
    st.add_argument("job", nargs="?")
    st.add_argument("--json", action="store_true", help="as -o json")
    add_output(st)
    st.add_argument("--state", action="append", help="only jobs in these states (repeat or comma-separate)")
    st.add_argument("--queue", action="append", help="only jobs of these queues and their sub-queues")
    st.add_argument("--limit", type=int, default=50)
    st.add_argument("--services", action="store_true", help="the stack's processes instead (as `tide health`)")
    st.set_defaults(fn=cmd_status)

    lg = sub.add_parser("logs", help="a job's pod output (stdout and stderr), from the node agents",
                        description="Print the output of a job's pods: each pod's latest attempt, or POD / "
                                    "--attempt N. Finished pods too. With several pods each line starts with "
                                    "[pod]. -f follows until the pods end.")
    lg.add_argument("job")
    lg.add_argument("pod", nargs="?", help="one pod (name, or name.aN for attempt N)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the pods end")
    lg.add_argument("--attempt", type=int, help="the placement attempt (default: each pod's latest)")
    lg.add_argument("--tail", type=int, help="only the last N lines (then, with -f, everything new)")
    lg.set_defaults(fn=cmd_logs)

    d = sub.add_parser("describe", help="a job's spec, state and every event of its life, with reason codes")
    d.add_argument("job")
    d.add_argument("-o", "--output", choices=("table", "json", "yaml"), default=None)
    d.set_defaults(fn=cmd_describe)

    c = sub.add_parser("cancel", help="cancel a job (stops its pods); a finished job: nothing to cancel, exit 0",
                       description="Cancel a job. A job that has already finished (succeeded, failed, cancelled, "
                                   "rejected) is left as it is: `job X already succeeded; nothing to cancel`, exit 0.")
    c.add_argument("job")
    c.add_argument("--wait", action="store_true")
    c.add_argument("--timeout", type=float, default=120)
    c.set_defaults(fn=cmd_cancel)

    n = sub.add_parser("nodes", help="nodes and their allocation")
    n.add_argument("--json", action="store_true", help="as -o json")
    add_output(n)
    n.set_defaults(fn=cmd_nodes)

    q = sub.add_parser("queues", help="queues: quotas, usage, jobs per state; --apply FILE replaces the tree")
    q.add_argument("--json", action="store_true", help="as -o json")
    add_output(q)
    q.add_argument("--apply", metavar="FILE", help="YAML/JSON queue tree to apply at run time")
    q.set_defaults(fn=cmd_queues)

    sub.add_parser("watch", help="live job events").set_defaults(fn=cmd_watch)

    comp = sub.add_parser("completion", help="shell completion script: eval \"$(tide completion bash)\"")
    comp.add_argument("shell", choices=("bash", "zsh"))
    comp.set_defaults(fn=cmd_completion)

    sub.add_parser("schema", help="the job spec's JSON Schema (docs/jobspec.schema.json)").set_defaults(
        fn=cmd_schema)

    try:
        from tide.cli.sim import add_sim_parser
    except ImportError:
        pass
    else:
        add_sim_parser(sub)
    return parser


def add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=FORMATS, default=None, help="table (default), wide, json, yaml")


def tide_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tide-scheduler")
    except PackageNotFoundError:
        return "unknown"


def split_wrapped(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`tide ... submit [flags] -- COMMAND...`: the arguments before `--`, and the command (None without one)."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    if "submit" not in argv[:cut]:
        return argv, None
    return argv[:cut], argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    argv, wrapped = split_wrapped(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    if wrapped is not None:
        args.wrapped = wrapped
    configure_logging("cli", fmt="console", level=os.environ.get("TIDE_LOG_LEVEL", "warning"))
    try:
        handler = args.fn if hasattr(args, "fn") else args.handler  # `tide sim` registers `handler`
        return int(handler(args))
    except Rejected as exc:
        print(f"rejected: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BadInput as exc:
        print(f"tide: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except StackError as exc:
        print(f"tide: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except ServiceUnavailable as exc:
        print(f"tide: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except TimeoutError as exc:
        print(f"tide: timed out: {exc or 'no answer'}", file=sys.stderr)
        return EXIT_FAIL
    except (nats.errors.Error, OSError) as exc:
        print(f"tide: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
