"""End-to-end latency through the live services: submit -> placed and submit -> running, at load.

Starts the real stack (NATS JetStream, Redis, queue, placer, metrics) on free ports with N simulated
nodes (8 x H100 each). The node agents are simulated in this process (``SimAgent``): each node has its
own NATS connection and credentials, registers, heartbeats (every 2 s, its running pods in a header, GPU samples
and the pods' usage every 5 s, on the subjects the real agent uses for each), acknowledges start commands (one
request per node per placer cycle) and reports pods started and exited (one status batch per heartbeat) over the
same subjects and permissions as the real agent, but runs no
process (a pod "runs" for the seconds of its `sleep N` command). A load generator in this process
submits 1-GPU jobs through JetStream at each rate for a bounded time, and follows their events.
Prints JSON and a one-line summary.

Per rate it reports, over the window from the first submission until every job has finished: NATS messages per
job from the server's own counters (``/varz`` in_msgs + out_msgs deltas, submissions included; the benchmark's
observer connection, which follows the jobs' placed/running/succeeded events, is read from ``/connz`` and left
out), split by client and, for the messages the server sent, by subscription (``/connz?subs=detail``), and CPU
seconds per job of every stack process (utime + stime deltas of ``/proc/<pid>/stat``), each both raw and net of what the
idle stack (heartbeats, ticks, polls; measured for 5 s before the first rate) costs over the same time.

    .venv/bin/python bench/e2e_latency.py --json [--nodes 1000] [--rates 100,400,600] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import nats
from tide import subjects
from tide.bus.nats import publish
from tide.core.lifecycle import transition_key, transitions_to_report
from tide.schemas.events import (
    NODE_COMMAND,
    CommandAck,
    ExitReason,
    GpuSample,
    JobEvent,
    NodeRegistered,
    PodExited,
    PodStarted,
    PodStatusBatch,
    PodUsage,
    StartPod,
    StartPods,
    Telemetry,
)
from tide.schemas.node import NodeDescription, default_h100_node
from tide.stack.auth import node_user
from tide.stack.launcher import Stack, StackInfo

HEARTBEAT_S = 2.0  # the agents' default (TIDE_HEARTBEAT_S)
TELEMETRY_S = 5.0  # the agents' default (TIDE_TELEMETRY_S): a beat carries GPU samples when this long has passed
STARTS: Counter[str] = Counter()  # job id -> how many times a simulated agent started its (one) pod


class SimAgent:
    """The node agent's protocol without processes (one NATS connection per node, its own user)."""

    def __init__(self, info: StackInfo, node: NodeDescription) -> None:
        self.info, self.node = info, node
        self.tasks: set[asyncio.Task[None]] = set()
        self.transitions: list[PodStarted | PodExited] = []  # sent with the next heartbeat, as the agent does
        self.answered: set[str] = set()  # pending starts answered 'started': reported only with their exit
        self.running: dict[str, StartPod] = {}  # "<job>/<pod>" (the agent's key) -> its start
        self.seq = 0
        self.sampled_at = 0.0  # monotonic time of the last beat with samples; 0: none yet

    async def start(self) -> None:
        node_id = self.node.node_id
        self.nc = await nats.connect(self.info.nats_url, user=node_user(node_id),
                                     password=self.info.passwords[node_user(node_id)],
                                     inbox_prefix=subjects.node_inbox_prefix(node_id), max_reconnect_attempts=-1)
        self.js = self.nc.jetstream()
        await self.nc.subscribe(subjects.node_cmd(node_id), cb=self.on_command)
        await publish(self.js, subjects.node_status(node_id), NodeRegistered(node=self.node))

    async def heartbeat(self) -> None:
        """As the agent beats: one message, on the telemetry subject with GPU samples and the pods' usage every
        ``TELEMETRY_S``, else on the heartbeat subject; the running pods in its header."""
        node_id, now = self.node.node_id, time.monotonic()
        self.seq += 1
        sampled = not self.sampled_at or now - self.sampled_at >= TELEMETRY_S - 1e-3
        if sampled:
            self.sampled_at = now
        beat = Telemetry(node_id=node_id, running_pods=len(self.running), seq=self.seq, heartbeat_s=HEARTBEAT_S,
                         gpus=self.samples() if sampled else [], pods=self.usage() if sampled else [])
        await self.nc.publish(subjects.telemetry(node_id) if sampled else subjects.heartbeat(node_id),
                              beat.to_bytes(), headers={subjects.PODS_HEADER: ",".join(sorted(self.running)),
                                                        subjects.PODS_AT_HEADER: repr(time.time())})
        if self.transitions:
            items, self.transitions = self.transitions, []
            report = transitions_to_report(items, self.answered)
            self.answered.difference_update(transition_key(t) for t in items if isinstance(t, PodStarted))
            if report:
                await publish(self.js, subjects.node_status(self.node.node_id),
                              PodStatusBatch(node_id=self.node.node_id, items=report))

    def samples(self) -> list[GpuSample]:
        """What the simulated NVML backend reports: every GPU, busy where a running pod holds it."""
        busy = {g.index for cmd in self.running.values() for g in cmd.gpus}
        return [GpuSample(index=g.index, uuid=g.uuid, utilization_ratio=0.9 if g.index in busy else 0.0,
                          memory_used_bytes=(40 << 30) if g.index in busy else 0, memory_total_bytes=g.memory_mib << 20,
                          memory_bandwidth_ratio=0.5 if g.index in busy else 0.0, sm_clock_hz=1.98e9,
                          power_watts=500.0 if g.index in busy else 70.0, temperature_c=55.0)
                for g in self.node.gpus]

    def usage(self) -> list[PodUsage]:
        return [PodUsage(job_id=cmd.job_id, pod=cmd.pod, gpu_memory_bytes=40 << 30, peak_memory_bytes=40 << 30)
                for cmd in self.running.values()]

    async def on_command(self, msg) -> None:
        command = NODE_COMMAND.validate_json(msg.data)
        if isinstance(command, StartPods):
            await msg.respond(CommandAck(ok=True, acks=[self.start_pod(c) for c in command.starts]).model_dump_json()
                              .encode())
            self.told({f"{c.job_id}/{c.pod}" for c in command.starts})
        elif isinstance(command, StartPod):
            await msg.respond(self.start_pod(command).model_dump_json().encode())
            self.told({f"{command.job_id}/{command.pod}"})
        elif msg.reply:  # a stop the placer only tells (fencing) has no reply subject
            await msg.respond(CommandAck(ok=True).model_dump_json().encode())

    def told(self, keys: set[str]) -> None:
        """These starts were answered: their pending PodStarted stay home while the pods run (as the agent)."""
        self.answered.update(keys & {transition_key(t) for t in self.transitions if isinstance(t, PodStarted)})

    def start_pod(self, cmd: StartPod) -> CommandAck:
        STARTS[cmd.job_id] += 1
        self.running[f"{cmd.job_id}/{cmd.pod}"] = cmd
        self.transitions.append(PodStarted(node_id=self.node.node_id, job_id=cmd.job_id, pod=cmd.pod, pid=0))
        task = asyncio.get_running_loop().create_task(self.run_pod(cmd))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return CommandAck(ok=True, started=True)

    async def run_pod(self, cmd: StartPod) -> None:
        seconds = float(cmd.command[1]) if cmd.command[0] == "sleep" else 0.0
        await asyncio.sleep(seconds)
        self.running.pop(f"{cmd.job_id}/{cmd.pod}", None)
        self.transitions.append(PodExited(node_id=self.node.node_id, job_id=cmd.job_id, pod=cmd.pod, exit_code=0,
                                          reason=ExitReason.COMPLETED))

    async def close(self) -> None:
        await self.nc.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def syscalls(pid: int) -> tuple[int, int]:
    """(read, write) system calls the process made so far (``/proc/<pid>/io`` syscr, syscw): each socket read or
    write is one, and on a virtual machine each costs tens of microseconds."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def nats_stats(info: StackInfo, observer: str) -> tuple[int, int, int]:
    """(in_msgs, out_msgs) of the NATS server (``/varz``), and the messages it exchanged with the connection
    named ``observer`` (``/connz``: in + out), which are the benchmark's, not the stack's."""
    base = f"http://127.0.0.1:{info.monitor_ports['nats']}"
    with urllib.request.urlopen(f"{base}/varz", timeout=5) as r:
        varz = json.load(r)
    own = 0
    with urllib.request.urlopen(f"{base}/connz?limit=100000", timeout=5) as r:
        for conn in json.load(r).get("connections", []):
            if conn.get("name") == observer:
                own += int(conn.get("in_msgs", 0)) + int(conn.get("out_msgs", 0))
    return int(varz["in_msgs"]), int(varz["out_msgs"]), own


def messages_by_client(info: StackInfo) -> Counter[str]:
    """Messages each client exchanged with the NATS server so far (``/connz``: in + out), by service; every node
    agent's connection counts as "agents". Where the stack's messages go, not a second total: the server's own
    JetStream traffic (acks it sends, deliveries) shows on the client that receives it."""
    base = f"http://127.0.0.1:{info.monitor_ports['nats']}"
    with urllib.request.urlopen(f"{base}/connz?limit=100000", timeout=5) as r:
        conns = json.load(r).get("connections", [])
    by: Counter[str] = Counter()
    for conn in conns:
        name = conn.get("name") or ""
        by[name if name.startswith(("tide-", "bench-")) else "agents"] += int(conn.get("in_msgs", 0)) + int(
            conn.get("out_msgs", 0))
    return by


def deliveries_by_subscription(info: StackInfo) -> Counter[tuple[str, str]]:
    """Messages the server delivered so far to each (client, subscription) (``/connz?subs=detail``), a node's own
    subjects and every inbox folded into one name each: where the stack's out-messages go."""
    base = f"http://127.0.0.1:{info.monitor_ports['nats']}"
    with urllib.request.urlopen(f"{base}/connz?limit=100000&subs=detail", timeout=5) as r:
        conns = json.load(r).get("connections", [])
    by: Counter[tuple[str, str]] = Counter()
    for conn in conns:
        name = conn.get("name") or ""
        client = name if name.startswith(("tide-", "bench-")) else "agents"
        for sub in conn.get("subscriptions_list_detail") or []:
            tokens = sub["subject"].split(".")
            if tokens[0].startswith("_INBOX"):
                subject = "<inbox>"
            elif tokens[:2] == ["tide", "node"] and len(tokens) == 4:
                subject = f"tide.node.<id>.{tokens[3]}"
            else:
                subject = sub["subject"]
            by[(client, subject)] += int(sub.get("msgs", 0))
    return by


def placer_cycles(info: StackInfo) -> tuple[float, float]:
    """(cycles, seconds spent in them) of every placer, from its own /metrics (``tide_placer_cycle_duration``)."""
    count = total = 0.0
    for url in info.placer_metrics_urls.values():
        with urllib.request.urlopen(url, timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("tide_placer_cycle_duration_seconds_count"):
                    count += float(line.rsplit(" ", 1)[1])
                elif line.startswith("tide_placer_cycle_duration_seconds_sum"):
                    total += float(line.rsplit(" ", 1)[1])
    return count, total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


OBSERVER = "bench-observer"


async def run_rate(info: StackInfo, pids: dict[str, int], rate: int, seconds: float, run_s: float,
                   idle: dict[str, float]) -> dict:
    nc = await nats.connect(info.nats_url, user="admin", password=info.passwords["admin"], name=OBSERVER)
    load = await nats.connect(info.nats_url, user="admin", password=info.passwords["admin"], name="bench-load")
    js = load.jetstream()  # submissions are the jobs' own messages: counted with the stack's
    submitted: dict[str, float] = {}
    placed: dict[str, float] = {}
    running: dict[str, float] = {}
    finished: dict[str, float] = {}
    outcomes: dict[str, list[str]] = {}  # every terminal event of each job, duplicates included

    async def on_event(msg) -> None:
        event = JobEvent.model_validate_json(msg.data)
        if event.job_id in submitted:
            if event.kind == "placed":
                placed.setdefault(event.job_id, time.monotonic())
            elif event.kind == "running":
                running.setdefault(event.job_id, time.monotonic())
            else:
                finished.setdefault(event.job_id, time.monotonic())
                outcomes.setdefault(event.job_id, []).append(event.kind)

    for kind in ("placed", "running", "succeeded", "failed"):
        await nc.subscribe(f"tide.events.job.*.{kind}", cb=on_event)
    await nc.flush()
    msgs0 = nats_stats(info, OBSERVER)
    clients0 = messages_by_client(info)
    deliveries0 = deliveries_by_subscription(info)
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    calls0 = {name: syscalls(pid) for name, pid in pids.items()}
    cycles0 = placer_cycles(info)
    own0, wall0 = time.process_time(), time.monotonic()
    spec = {"metadata": {"name": "lat"}, "spec": {"template": {"command": ["sleep", str(run_s)],
                                                                "resources": {"gpu": 1, "cpuMilli": 1000}}}}
    start = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        job_id = f"r{rate}-{i}"
        body = json.dumps({"schema_version": 1, "job_id": job_id, "spec": spec}).encode()
        submitted[job_id] = time.monotonic()
        await js.publish(subjects.JOB_SUBMIT, body, headers={"Tide-Job-Id": job_id})
    offered_s = time.monotonic() - start
    deadline = time.monotonic() + max(90.0, seconds * 3)
    while len(finished) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.2)  # the last events' acks
    cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    calls = {name: [b - a for a, b in zip(calls0[name], syscalls(pid), strict=True)] for name, pid in pids.items()}
    own_cpu, wall = time.process_time() - own0, time.monotonic() - wall0
    msgs1 = nats_stats(info, OBSERVER)
    clients = messages_by_client(info) - clients0
    deliveries = deliveries_by_subscription(info) - deliveries0
    cycles, cycle_s = (b - a for a, b in zip(cycles0, placer_cycles(info), strict=True))
    await nc.close()
    await load.close()
    to_placed = [(placed[j] - submitted[j]) * 1000 for j in placed]
    to_running = [(running[j] - submitted[j]) * 1000 for j in running]
    last = max(placed.values(), default=start)
    done = max(len(finished), 1)
    starts = [STARTS[j] for j in submitted]
    in_msgs, out_msgs, observer = (b - a for a, b in zip(msgs0, msgs1, strict=True))
    stack_msgs = in_msgs + out_msgs - observer
    idle_msgs = idle["nats_msgs_per_s"] * wall
    cpu_ms = {name: c * 1000 / done for name, c in cpu.items()}
    net_ms = {name: max(0.0, (c - idle[name] * wall) * 1000 / done) for name, c in cpu.items()}
    return {
        "rate_offered": rate,
        "jobs": n,
        "offered_rate_achieved": round(n / offered_s, 1),
        "placed": len(placed),
        "finished": len(finished),
        # each job ends once, succeeded, and its pod was started once: nothing lost, nothing run twice
        "succeeded": sum(1 for kinds in outcomes.values() if kinds == ["succeeded"]),
        "not_succeeded": sorted(j for j in submitted if outcomes.get(j, []) != ["succeeded"])[:20],
        "pods_started_twice": sum(1 for c in starts if c > 1),
        "pods_never_started": sum(1 for c in starts if c == 0),
        "sustained_placed_per_s": round(len(placed) / max(last - start, 1e-9), 1),
        "submit_to_placed_ms": {"p50": round(pct(to_placed, 0.5), 1), "p99": round(pct(to_placed, 0.99), 1)},
        "submit_to_running_ms": {"p50": round(pct(to_running, 0.5), 1), "p99": round(pct(to_running, 0.99), 1)},
        # the tail's shape: jobs placed later than 50 ms after submission, and how many distinct 250 ms windows of
        # submission they fall in (few windows: stalls of the stack; as many as jobs: a slow path for some jobs)
        "placed_over_50ms": len(slow := [j for j in placed if placed[j] - submitted[j] > 0.05]),
        "placed_over_50ms_windows": len({int((submitted[j] - start) / 0.25) for j in slow}),
        "window_s": round(wall, 1),
        # NATS messages per job from the server's counters (in + out), without the observer's own traffic
        "nats_msgs_per_job": round(stack_msgs / done, 1),
        "nats_msgs_per_job_net_of_idle": round((stack_msgs - idle_msgs) / done, 1),
        "nats_in_out_per_job": [round(in_msgs / done, 1), round(out_msgs / done, 1)],
        "observer_msgs_per_job": round(observer / done, 1),
        "nats_msgs_per_job_by_client": {name: round(n / done, 2) for name, n in sorted(clients.items())},
        # the out-messages of the above by subscription (client -> subject -> deliveries per job), idle included
        "nats_deliveries_per_job_by_subscription": {
            client: {subject: round(n / done, 3) for (c, subject), n in sorted(deliveries.items()) if c == client}
            for client in sorted({c for c, _ in deliveries})},
        "placer_cpu_ms_per_decision": round(cpu["placer"] * 1000 / max(len(placed), 1), 2),
        # scheduling cycles (every placer's, the idle ticks included) per job, and their mean wall time
        "placer_cycles_per_job": round(cycles / done, 2),
        "placer_cycle_ms_mean": round(cycle_s * 1000 / max(cycles, 1), 2),
        # CPU of each process of the stack per finished job (submit to exit), in ms: raw, and net of idle
        "cpu_ms_per_job": {name: round(c, 2) for name, c in cpu_ms.items()},
        "cpu_ms_per_job_total": round(sum(cpu_ms.values()), 2),
        "cpu_ms_per_job_net_of_idle": {name: round(c, 2) for name, c in net_ms.items()},
        "cpu_ms_per_job_net_of_idle_total": round(sum(net_ms.values()), 2),
        # read and write system calls of each process per job (raw: the idle stack's included)
        "syscalls_per_job": {name: [round(c / done, 1) for c in rw] for name, rw in calls.items()},
        "load_generator_and_agents_cpu_ms_per_job": round(own_cpu * 1000 / done, 2),
        "load_generator_and_agents_cores": round(own_cpu / wall, 2),  # this process's share of the cores
    }


async def main_async(args: argparse.Namespace) -> dict:
    nodes = [default_h100_node(f"n{i:04d}", rack=f"r{i // 16}") for i in range(args.nodes)]
    with tempfile.TemporaryDirectory() as tmp:
        home = args.home or tmp
        stack = Stack(Path(home), nodes, start_agents=False,
                      env={"metrics": {"TIDE_METRICS_POLL_S": str(args.metrics_poll_s)}})
        loop = asyncio.get_running_loop()
        info = await loop.run_in_executor(None, stack.start)
        agents = [SimAgent(info, n) for n in nodes]
        try:
            for i in range(0, len(agents), 50):
                await asyncio.gather(*[a.start() for a in agents[i:i + 50]])
            stop = asyncio.Event()

            async def beats(agent: SimAgent, phase: float) -> None:
                # Each agent on its own 2 s timer, as real agents started at different times are: all 1,000
                # heartbeats at one instant would be a burst that no real cluster sends.
                await asyncio.sleep(phase)
                while not stop.is_set():
                    await agent.heartbeat()
                    await asyncio.sleep(HEARTBEAT_S)

            phases = random.Random(0)
            beating = asyncio.gather(*[beats(a, phases.uniform(0, HEARTBEAT_S)) for a in agents])
            admin = await nats.connect(info.nats_url, user="admin", password=info.passwords["admin"])
            while len(json.loads((await admin.request(subjects.API_NODES, b"{}", timeout=10)).data)["nodes"]) \
                    < len(nodes):
                await asyncio.sleep(0.5)
            await admin.close()
            pids = {name: p.pid for name, p in stack.procs.items()}
            # registrations settle, and metrics' first poll after them (its one read of every node's description,
            # ~0.2 s of CPU at 1,000 nodes) is over: before, it fell into the idle window below and put ~0.035 of
            # a core of one-off work in metrics' idle figure, which the net-of-idle figures then subtracted
            await asyncio.sleep(2 + args.metrics_poll_s)
            # the 1,000 simulated agents and their connections live to the end: out of this process's full
            # garbage collections, which otherwise stalled the load generator and the observer for 60-350 ms
            gc.collect()
            gc.freeze()
            idle0, wall0 = {name: cpu_seconds(pid) for name, pid in pids.items()}, time.monotonic()
            msgs0 = nats_stats(info, OBSERVER)
            await asyncio.sleep(5)  # no jobs: what heartbeats, ticks and polls cost on their own
            msgs1 = nats_stats(info, OBSERVER)
            idle_wall = time.monotonic() - wall0
            idle = {name: (cpu_seconds(pid) - idle0[name]) / idle_wall for name, pid in pids.items()}
            idle["nats_msgs_per_s"] = (msgs1[0] + msgs1[1] - msgs0[0] - msgs0[1]) / idle_wall
            idle_cores = {name: round(v, 3) for name, v in idle.items() if name in pids}
            results = []
            for rate in [int(r) for r in args.rates.split(",")]:
                results.append(await run_rate(info, pids, rate, args.seconds, args.run_s, idle))
                await asyncio.sleep(1)  # every job of this rate has finished: let the stack settle
            stop.set()
            await beating
        finally:
            for a in agents:
                await a.close()
            await loop.run_in_executor(None, stack.stop)
    return {"bench": "e2e_latency", "nodes": args.nodes, "seconds_per_rate": args.seconds,
            "machine": f"{os.cpu_count()} CPUs shared by the load generator, the simulated agents and every service",
            "idle_cores": idle_cores, "idle_nats_msgs_per_s": round(idle["nats_msgs_per_s"], 1), "rates": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rates", default="100,400,600")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each rate is offered")
    parser.add_argument("--run-s", type=float, default=2.0, help="how long each job runs")
    parser.add_argument("--metrics-poll-s", type=float, default=5.0,
                        help="how often the metrics service reads the cluster state (TIDE_METRICS_POLL_S)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--home", help="keep the stack's state and logs here (default: a temporary folder)")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
    parts = [f"{r['rate_offered']}/s: placed p50 {r['submit_to_placed_ms']['p50']} ms p99 "
             f"{r['submit_to_placed_ms']['p99']} ms, sustained {r['sustained_placed_per_s']}/s, "
             f"{r['nats_msgs_per_job_net_of_idle']} NATS msgs/job, "
             f"{r['cpu_ms_per_job_net_of_idle_total']} ms CPU/job (net of idle; {r['cpu_ms_per_job_total']} all), "
             f"{r['placer_cycles_per_job']} placer cycles/job, "
             f"{r['succeeded']}/{r['jobs']} succeeded once, {r['pods_started_twice']} started twice"
             for r in result["rates"]]
    print(f"e2e_latency on {result['nodes']} nodes: " + "; ".join(parts))


if __name__ == "__main__":
    main()
