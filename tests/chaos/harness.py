"""The chaos harness: a steady mixed load on a real stack, one fault, and the invariants checked on
ground truth (files the pods themselves write), not on what the control plane believes.

Every pod of the load runs ``WITNESS``: it appends to its own file (one per process) a start record
(job, pod, attempt, the GPUs the agent gave it via CUDA_VISIBLE_DEVICES, its MPS share), then an
"alive" stamp every ``TICK`` seconds, and "e" when it completed (or "x" on SIGTERM). A pod killed
with SIGKILL leaves no end line: it died within ``TICK`` of its last stamp (the bound used below).

``run_fault`` returns one report per fault and prints it as one JSON line (``pytest -s``):
``{"fault", "jobs", "lost", "ran_twice", "completed_twice", "gpus_held_twice", "leftover_reservations",
"leftover_claims", "partial_gangs", "stray_pods", "recovery_s", ...}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from tide.client import TideClient
from tide.stack.launcher import Stack
from tide.store import keys
from tide.store.redis import redis_for

from tests.helpers import PY, small_node

TICK = 0.1
NODES = 4
GPUS_PER_NODE = 8
RESERVATION_TTL_S = 4.0
TERMINAL = {"succeeded", "failed", "cancelled", "rejected", "unschedulable", "preempted"}

# short lease settings, as in tests/e2e/test_node_loss.py (the lease is at least twice the heartbeat)
AGENT_ENV = {"TIDE_NODE_LEASE_S": "2", "TIDE_FENCE_GRACE_S": "1", "TIDE_HEARTBEAT_S": "0.5"}
# a gang's reservation outlives the wait for the agents' start acknowledgements
PLACER_ENV = {"TIDE_NODE_LOST_AFTER_S": "3", "TIDE_RESERVATION_TTL_S": str(RESERVATION_TTL_S),
              "TIDE_START_ACK_TIMEOUT_S": "2"}

WITNESS = r"""
import json, os, signal, sys, time
e = os.environ
dur = float(sys.argv[1]) if len(sys.argv) < 4 or e["TIDE_ATTEMPT"] == "1" else float(sys.argv[3])
tick = float(sys.argv[2])
name = "%s.a%s.%d" % (e["TIDE_POD_NAME"], e["TIDE_ATTEMPT"], os.getpid())
f = open(os.path.join(e["WITNESS_DIR"], name), "a", buffering=1)
def stopped(signum, frame):
    f.write("x %.6f\n" % time.time())
    os._exit(143)
signal.signal(signal.SIGTERM, stopped)
f.write(json.dumps({
    "t": time.time(), "job": e["TIDE_JOB_ID"], "pod": e["TIDE_POD_NAME"], "attempt": int(e["TIDE_ATTEMPT"]),
    "index": int(e["TIDE_POD_INDEX"]), "world": int(e["TIDE_WORLD_SIZE"]), "node": e.get("TIDE_NODE_ID"),
    "pid": os.getpid(), "gpus": [g for g in e.get("CUDA_VISIBLE_DEVICES", "").split(",") if g],
    "nvidia": e.get("NVIDIA_VISIBLE_DEVICES"), "sm": e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    "mem": e.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")}) + "\n")
end = time.time() + dur
while True:
    left = end - time.time()
    if left <= 0:
        break
    time.sleep(min(tick, left))
    f.write("a %.6f\n" % time.time())
f.write("e %.6f\n" % time.time())
"""


def witness_command(seconds: float, later_s: float | None = None) -> list[str]:
    """A witness pod that works ``seconds`` (``later_s`` in attempts after the first, when given)."""
    return [PY, "-I", "-S", "-c", WITNESS, str(seconds), str(TICK), *([str(later_s)] if later_s is not None else [])]


def spec(name: str, witness: Path, seconds: float, replicas: int = 1, priority: str | None = None,
         later_s: float | None = None, **resources: object) -> dict:
    meta: dict[str, Any] = {"name": name}
    if priority:
        meta["priorityClass"] = priority
    return {"metadata": meta, "spec": {"replicas": replicas, "template": {
        "command": witness_command(seconds, later_s), "env": {"WITNESS_DIR": str(witness)},
        "resources": dict(resources)}}}


def load(witness: Path, gang_s: float = 2.5, gang_later_s: float | None = None) -> dict[str, dict]:
    """42 jobs, 69 pods: one 16-pod gang (first, so it is running when the fault comes), six small
    gangs, eight GPU shares, 27 single-GPU jobs; on 4 nodes x 8 GPUs."""
    jobs: dict[str, dict] = {"gang16": spec("gang16", witness, gang_s, replicas=16, later_s=gang_later_s,
                                             gpu=1)}
    for i in range(6):
        jobs[f"gang{i}"] = spec(f"gang{i}", witness, 1.0, replicas=2 + i % 3, gpu=1 + i % 2)
    for i in range(8):
        jobs[f"share{i}"] = spec(f"share{i}", witness, 1.0, gpuShare={"memoryMiB": 16384, "smPercent": 25})
    for i in range(27):
        jobs[f"single{i}"] = spec(f"single{i}", witness, 0.6 + (i % 4) * 0.2, gpu=1)
    return jobs


def replicas_of(job_spec: dict) -> int:
    return int(job_spec["spec"]["replicas"])


# ---------------------------------------------------------------- witness records
@dataclass
class Record:
    job: str
    pod: str
    attempt: int
    index: int
    node: str | None
    pid: int
    gpus: list[str]
    nvidia: str | None
    sm: int | None
    start: float
    last: float
    how: str  # "e" completed, "x" stopped by SIGTERM, "k" killed (no end line)
    file: str = ""
    reaped: float | None = None  # killed: when its node agent logged the pod's exit (its process group reaped)

    @property
    def end(self) -> float:
        """When it was gone at the latest: its end line, else one tick (and scheduling slack) past its last stamp,
        or when its agent reaped it if that came first (a SIGKILL reaches the whole process group at once, and the
        agent logs the exit once the group's leader is reaped: the witness wrote nothing after)."""
        if self.how in ("e", "x"):
            return self.last
        slack = self.last + 2 * TICK
        return min(slack, self.reaped) if self.reaped is not None and self.reaped >= self.last else slack

    @property
    def completed(self) -> bool:
        return self.how == "e"


def read_records(witness: Path) -> list[Record]:
    out = []
    for f in sorted(witness.iterdir()):
        lines = f.read_text().splitlines()
        try:
            head = json.loads(lines[0])
        except (IndexError, ValueError):
            continue  # killed before it wrote its start line: it never ran its workload
        last, how = head["t"], "k"
        for line in lines[1:]:
            parts = line.split()
            if len(parts) != 2:
                continue  # a line cut short by SIGKILL
            try:
                ts = float(parts[1])
            except ValueError:
                continue
            last = max(last, ts)
            if parts[0] in ("e", "x"):
                how = parts[0]
        out.append(Record(job=head["job"], pod=head["pod"], attempt=head["attempt"], index=head["index"],
                          node=head["node"], pid=head["pid"], gpus=head["gpus"], nvidia=head["nvidia"],
                          sm=int(head["sm"]) if head["sm"] else None, start=head["t"], last=last, how=how,
                          file=f.name))
    return out


def live_witness_pids(witness: Path) -> list[int]:
    """Pods still running anywhere (whatever the control plane believes): processes whose environment
    names this test's WITNESS_DIR."""
    marker = b"WITNESS_DIR=" + str(witness).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if marker in proc.joinpath("environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except (OSError, IndexError):
            continue
    return found


def overlaps(a: Record, b: Record) -> bool:
    return a.start < b.end and b.start < a.end


def ran_twice(records: list[Record]) -> list[str]:
    """Pods two of whose processes (two attempts, or one attempt started twice) were alive at once."""
    by_pod: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        by_pod.setdefault((r.job, r.pod), []).append(r)
    bad = []
    for (_, pod), rs in sorted(by_pod.items()):
        pairs = [(a, b) for i, a in enumerate(rs) for b in rs[i + 1:] if overlaps(a, b)]
        if pairs:
            bad.append(f"{pod}: " + "; ".join(f"{a.file}[{a.start:.3f}-{a.end:.3f} {a.node}] overlaps "
                                              f"{b.file}[{b.start:.3f}-{b.end:.3f} {b.node}]" for a, b in pairs))
    return bad


def completed_twice(records: list[Record], sizes: dict[str, int],
                    unobservable: Callable[[Record], bool] = lambda r: False) -> tuple[list[str], list[str]]:
    """(duplicates, gang reruns). A duplicate: one attempt of a pod completed twice, or a pod ran again after
    an attempt in which every pod of its job had completed (the job was done). A gang rerun: a pod that had
    completed ran again because another member of its gang was lost (the gang is requeued whole: by design).
    ``unobservable``: completions no placer could hear of (on a node that went silent past its lease at that
    moment, or died with its agent); an attempt finished only that way may run again (at least once)."""
    by_attempt: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        by_attempt.setdefault((r.job, r.attempt), []).append(r)
    finished = {key for key, rs in by_attempt.items()
                if len({r.index for r in rs if r.completed and not unobservable(r)}) == sizes.get(key[0], 1)}
    by_pod: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        by_pod.setdefault((r.job, r.pod), []).append(r)
    dups, reruns = [], []
    for (job, pod), rs in sorted(by_pod.items()):
        rs.sort(key=lambda r: r.start)
        done = [r for r in rs if r.completed]
        same = len({r.attempt for r in done}) < len(done)
        again = [(r, later) for r in done for later in rs if later.attempt > r.attempt]
        text = ", ".join(f"{r.file} on {r.node} [{r.start:.3f}-{r.end:.3f} {r.how}]" for r in rs)
        if same or any((job, r.attempt) in finished for r, _ in again):
            dups.append(f"{pod}: {text}")
        elif again:
            reruns.append(f"{pod}: {text}")
    return dups, reruns


def gpus_held_twice(records: list[Record]) -> list[str]:
    """GPUs that a whole-GPU pod held while any other pod held it too, or whose shares summed past 100% SMs."""
    by_gpu: dict[str, list[Record]] = {}
    for r in records:
        for g in r.gpus:
            by_gpu.setdefault(g, []).append(r)
    bad = []
    for gpu, rs in sorted(by_gpu.items()):
        for r in rs:
            others = [o for o in rs if o is not r and overlaps(r, o)]
            if r.sm is None and others:
                bad.append(f"{gpu}: {r.file} [{r.start:.3f}-{r.end:.3f}] with {[o.file for o in others]}")
                break
            if r.sm is not None:
                at_start = [o for o in rs if o.start <= r.start < o.end and o is not r]
                if r.sm + sum(o.sm or 100 for o in at_start) > 100:
                    bad.append(f"{gpu}: shares {[r.file, *[o.file for o in at_start]]} over 100% at {r.start:.3f}")
                    break
    return bad


def agent_pod_events(logs: Path, event: str) -> Iterator[tuple[dict[str, Any], str, int]]:
    """Every ``event`` line of the node agents' logs, with its pod's name and attempt (from ``<pod>.a<attempt>``)."""
    for f in logs.glob("agent-*.log"):
        for line in f.read_text(errors="replace").splitlines():
            if f'"{event}"' not in line:
                continue
            try:
                d = json.loads(line)
            except ValueError:
                continue
            name, _, attempt = str(d.get("pod", "")).rpartition(".a")
            if d.get("event") == event and attempt.isdigit():
                yield d, name, int(attempt)


def spawned_pods(logs: Path) -> set[tuple[str, str, int]]:
    """(job, pod, attempt) of every pod process a node agent started, from its log (``pod_started``): a pod
    killed by a fault between its spawn and its witness's first line still counts as started."""
    return {(d["job_id"], name, attempt) for d, name, attempt in agent_pod_events(logs, "pod_started")}


def agent_exits(logs: Path) -> dict[tuple[str, str, int, str], float]:
    """(job, pod, attempt, node) -> when the node agent logged the pod's exit (``pod_exited``, epoch seconds)."""
    out: dict[tuple[str, str, int, str], float] = {}
    for d, name, attempt in agent_pod_events(logs, "pod_exited"):
        try:
            at = datetime.fromisoformat(str(d["timestamp"]).replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError):
            continue
        out[(d["job_id"], name, attempt, str(d.get("node_id")))] = at
    return out


def with_agent_exits(records: list[Record], exits: dict[tuple[str, str, int, str], float]) -> list[Record]:
    """Each killed witness with the time its agent reaped it, where the agent logged it."""
    return [replace(r, reaped=exits.get((r.job, r.pod, r.attempt, str(r.node)))) if r.how == "k" else r
            for r in records]


def partial_gangs(records: list[Record], gang_sizes: dict[str, int],
                  spawned: set[tuple[str, str, int]] = frozenset()) -> list[str]:
    """Gang attempts that started some pods but not all (a pod counts as started when its witness wrote its
    start line or its agent logged its start), or, for an attempt none of whose pods was stopped or killed,
    whose pods were not all running together (one had completed before another started)."""
    attempts: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        if gang_sizes.get(r.job, 1) > 1:
            attempts.setdefault((r.job, r.attempt), []).append(r)
    bad = []
    for (job, attempt), rs in sorted(attempts.items()):
        started = {r.index for r in rs} | {i for i in range(gang_sizes[job]) if (job, f"{job}-{i}", attempt) in spawned}
        if len(started) != gang_sizes[job]:
            bad.append(f"{job} attempt {attempt}: {len(started)}/{gang_sizes[job]} pods started "
                       f"({sorted(started)}, on {sorted({r.node or '?' for r in rs})})")
        elif all(r.completed for r in rs) and max(r.start for r in rs) >= min(r.end for r in rs):
            bad.append(f"{job} attempt {attempt}: a pod started after another had completed")
    return bad


async def leftovers(redis: Redis) -> tuple[list[str], list[str]]:
    """Reservations and claims still in Redis (and GPU/CPU amounts still counted as used)."""
    resv = [f"{keys.RESERVATIONS}: {m}" for m in await redis.zrange(keys.RESERVATIONS, 0, -1)]
    resv_pattern = keys.reservation("*") if hasattr(keys, "reservation") else f"{keys.RESERVATION_PREFIX}*"
    resv += [k async for k in redis.scan_iter(match=resv_pattern)]
    resv += [f"{keys.EXPIRED_RESERVATIONS}: {m}" for m in await redis.lrange(keys.EXPIRED_RESERVATIONS, 0, -1)]
    claims = [f"{keys.CLAIMS_INDEX}: {m}" for m in await redis.smembers(keys.CLAIMS_INDEX)]
    claims += [k async for k in redis.scan_iter(match=keys.claim("*", "*"))]
    for node in await redis.smembers(keys.NODES):
        used = {f: v for f, v in (await redis.hgetall(keys.used(node))).items() if int(v) != 0}
        if used:
            claims.append(f"{keys.used(node)}: {used}")
    return sorted(resv), sorted(claims)


# ---------------------------------------------------------------- one fault under load
@dataclass
class Chaos:
    """What a fault needs: the stack, a client, the witness folder, and what the harness found out."""

    stack: Stack
    client: TideClient
    witness: Path
    victim: str | None = None  # the node of the 16-pod gang's first pod when the fault comes
    t_fault: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)


Step = Callable[[Chaos], Awaitable[None]]


async def until(check: Callable[[], Awaitable[Any]], timeout_s: float, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = await check()
        except Exception:  # noqa: BLE001 - a service may be restarting: ask again
            result = None
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(every_s)


async def submit(client: TideClient, job_spec: dict, job_id: str, timeout_s: float = 60.0) -> float:
    """Submit, retrying while the queue, NATS or Redis is away; returns when the queue accepted it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = await client.submit(job_spec, job_id=job_id, timeout_s=5)
            assert result.accepted, result
            return time.time()
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001 - ServiceUnavailable, TimeoutError, a NATS error while it restarts
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def gang_running(c: Chaos) -> Any:
    """The 16-pod gang runs and each of its pods has written its start line."""
    j = await c.client.job("gang16")
    started = {f.name.split(".a1.")[0] for f in c.witness.iterdir()
               if f.name.startswith("gang16-") and ".a1." in f.name}
    return j if j and j["state"] == "running" and len(started) == 16 else None


async def wait_all(client: TideClient, job_ids: list[str], timeout_s: float) -> dict[str, dict | None]:
    """Each job's final status; a job unknown or not terminal at the deadline stays as last seen."""
    last: dict[str, dict | None] = dict.fromkeys(job_ids)
    deadline = time.monotonic() + timeout_s
    open_ids = list(job_ids)
    while open_ids and time.monotonic() < deadline:
        for job_id in list(open_ids):
            try:
                j = await client.job(job_id, timeout_s=2)
            except Exception:  # noqa: BLE001 - restarting
                continue
            last[job_id] = j
            if j and j["state"] in TERMINAL:
                open_ids.remove(job_id)
        if open_ids:
            await asyncio.sleep(0.3)
    return last


async def run_fault(make_stack: Callable[..., Stack], tmp_path: Path, fault: str, inject: Step,
                    recover: Step | None = None, trigger: Step | None = None,
                    placer_env: dict[str, str] | None = None, gang_s: float = 2.5, gang_later_s: float | None = None,
                    jobs: dict[str, dict] | None = None, agent_env: dict[str, str] | None = None,
                    settle_s: float = 45.0, ha: bool = False) -> dict[str, Any]:
    """Start a 4 x 8 GPU stack, submit the load, wait for ``trigger`` (default: the 16-pod gang runs), note
    the fault time and ``inject`` the fault; submit a probe job right after it; ``recover`` (restart,
    SIGCONT); wait for every job to end, then check the invariants on the witness records and Redis."""
    witness = tmp_path / "witness"
    witness.mkdir()
    t0 = time.monotonic()
    env = {"placer": {**PLACER_ENV, **(placer_env or {})}, "agents": {**AGENT_ENV, **(agent_env or {})}}
    stack = make_stack([small_node(f"n{i}", gpus=GPUS_PER_NODE) for i in range(NODES)], env=env,
                       **({"ha": True} if ha else {}))
    client = await TideClient.connect(stack.info.settings_for("admin"))
    # admin has no Redis user; with Sentinels the client follows a failover (``ha``)
    redis = redis_for(stack.info.settings_for("placer")) if ha else \
        Redis.from_url(stack.info.redis_url("placer"), decode_responses=True)
    c = Chaos(stack, client, witness)
    jobs = dict(jobs) if jobs is not None else load(witness, gang_s, gang_later_s)
    first_id = next(iter(jobs))
    try:
        await submit(client, jobs[first_id], first_id)
        sem = asyncio.Semaphore(6)

        async def one(job_id: str) -> None:
            async with sem:
                await submit(client, jobs[job_id], job_id)

        rest = asyncio.gather(*[one(j) for j in jobs if j != first_id])
        first = await until(lambda: (trigger or gang_running)(c), 60, 0.02)
        assert first, f"the trigger never came: {await client.job(first_id)}"
        gang = await client.job(first_id)
        c.victim = next((p["node"] for p in gang["pods"] if p["node"]), None) if gang else None
        c.t_fault = time.time()
        await inject(c)
        probe = spec("probe", witness, 0.2, priority="online-serving")
        probe_task = asyncio.ensure_future(submit(client, probe, "probe", timeout_s=90))
        if recover is not None:
            await recover(c)
        probe_accepted = await probe_task
        await rest
        jobs["probe"] = probe
        final = await wait_all(client, list(jobs), settle_s)  # a job still open after this counts as lost
        # pods of an old attempt may still be winding down: give them a moment, then count the stragglers
        await until(lambda: asyncio.sleep(0, result=not live_witness_pids(witness)), 5, 0.2)
        strays = live_witness_pids(witness)
        resv, claims = await until(lambda: _clean(redis), RESERVATION_TTL_S + 2, 0.2) or await leftovers(redis)
    finally:
        await redis.aclose()
        await client.close()
    records = with_agent_exits(read_records(witness), agent_exits(stack.home / "logs"))
    sizes = {j: replicas_of(s) for j, s in jobs.items()}
    spawned = spawned_pods(stack.home / "logs")
    gangs = partial_gangs(records, sizes, spawned)
    silent = c.notes.pop("silent", None)  # (node, from, to): a node silent past its lease, or its agent dead

    def unobservable(r: Record) -> bool:
        return bool(silent and r.node == silent[0] and silent[1] - 0.5 <= r.end <= silent[2])

    dups, reruns = completed_twice(records, sizes, unobservable)
    states: dict[str, int] = {}
    for j in final.values():
        states[j["state"] if j else "unknown"] = states.get(j["state"] if j else "unknown", 0) + 1
    completed = {(r.job, r.pod) for r in records if r.completed}
    lost = [f"{job_id}: {j['state'] if j else 'unknown'}" for job_id, j in final.items()
            if not j or j["state"] not in TERMINAL]
    lost += [f"{job_id}: succeeded, yet pod {job_id}-{i} never completed"
             for job_id, j in final.items() if j and j["state"] == "succeeded"
             for i in range(sizes[job_id]) if (job_id, f"{job_id}-{i}") not in completed]
    probe_runs = [r for r in records if r.job == "probe"]
    after = [r.start for r in records if r.job != "probe" and r.start > c.t_fault]
    report: dict[str, Any] = {
        "fault": fault,
        "jobs": len(jobs),
        "pods": sum(sizes.values()),
        "pod_processes": len(records),
        "states": states,
        "lost": len(lost),
        "ran_twice": len(ran_twice(records)),
        "completed_twice": len(dups),
        "reruns_by_design": len(reruns),
        "gpus_held_twice": len(gpus_held_twice(records)),
        "leftover_reservations": len(resv),
        "leftover_claims": len(claims),
        "partial_gangs": len(gangs),
        "stray_pods": len(strays),
        "recovery_s": round(min(r.start for r in probe_runs) - c.t_fault, 2) if probe_runs else None,
        "probe_accepted_s": round(probe_accepted - c.t_fault, 2),
        "first_start_after_fault_s": round(min(after) - c.t_fault, 2) if after else None,
        **c.notes,
        **({"rescheduled_s": rescheduled_s(records, c.notes["node"], c.t_fault)} if c.notes.get("node") else {}),
        "test_s": round(time.monotonic() - t0, 1),
    }
    details = {"lost": lost, "ran_twice": ran_twice(records), "completed_twice": dups,
               "gpus_held_twice": gpus_held_twice(records), "leftover_reservations": resv,
               "leftover_claims": claims, "partial_gangs": gangs, "stray_pods": strays}
    report["details"] = {k: v for k, v in details.items() if v}
    print(json.dumps({k: v for k, v in report.items() if k != "details"}))
    if report["details"]:
        print(json.dumps({"fault": fault, "details": report["details"]}))
    report["records"], report["t_fault"] = records, c.t_fault
    return report


async def _clean(redis: Redis) -> tuple[list[str], list[str]] | None:
    resv, claims = await leftovers(redis)
    return None if resv or claims else (resv, claims)


def rescheduled_s(records: list[Record], node: str, t_fault: float) -> float | None:
    """From the fault until the first new attempt of a pod that was running on ``node`` at the fault started."""
    hit = {(r.job, r.pod) for r in records if r.node == node and r.start <= t_fault < r.end}
    starts = [r.start for r in records if (r.job, r.pod) in hit and r.start > t_fault and r.node != node]
    return round(min(starts) - t_fault, 2) if starts else None


def assert_invariants(report: dict[str, Any], allow: tuple[str, ...] = ()) -> None:
    for key in ("lost", "ran_twice", "completed_twice", "gpus_held_twice", "leftover_reservations",
                "leftover_claims", "partial_gangs", "stray_pods"):
        if key not in allow:
            assert report[key] == 0, f"{report['fault']}: {key} = {report[key]}: {report['details'].get(key)}"
    assert report["recovery_s"] is not None, f"{report['fault']}: the probe job never started"


def sigkill(stack: Stack, name: str) -> None:
    """kill -9 behind the launcher's back: its supervisor notices and restarts the process after its backoff."""
    os.kill(stack.procs[name].pid, signal.SIGKILL)
