"""Gangs on real NATS and Redis: all or nothing, under contention, crashes and silent agents."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from redis.asyncio import Redis
from tide.client import TideClient
from tide.schemas.node import default_h100_node
from tide.store import keys

from tests.helpers import job, small_node


def interval_pod(out_dir: Path, seconds: float) -> list[str]:
    """A pod that records [start, end, GPUs] in its own file (ground truth for overlap checks)."""
    script = (
        f"d={out_dir}; f=$d/$TIDE_POD_NAME.$$; echo \"start $(date +%s.%N) $CUDA_VISIBLE_DEVICES\" > $f; "
        f"sleep {seconds}; echo \"end $(date +%s.%N)\" >> $f"
    )
    return ["sh", "-c", script]


def read_intervals(out_dir: Path) -> list[dict]:
    rows = []
    for f in sorted(out_dir.iterdir()):
        lines = f.read_text().split("\n")
        start = lines[0].split()
        end = [ln for ln in lines if ln.startswith("end ")]
        rows.append({
            "pod": f.name.rsplit(".", 1)[0],
            "start": float(start[1]),
            "end": float(end[0].split()[1]) if end else None,
            "gpus": start[2].split(",") if len(start) > 2 else [],
        })
    return rows


def assert_no_gpu_overlap(rows: list[dict]) -> None:
    by_gpu: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        for g in r["gpus"]:
            by_gpu.setdefault(g, []).append((r["start"], r["end"] or float("inf")))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (s1, e1), (s2, _) in zip(spans, spans[1:], strict=False):
            assert s2 >= e1, f"{gpu} double-allocated: {s1}-{e1} overlaps {s2}"


async def test_three_gangs_of_eight_on_sixteen_gpus_never_partial(make_stack, tmp_path: Path) -> None:
    stack = make_stack([small_node("a", gpus=8), small_node("b", gpus=8)])
    out = tmp_path / "pods"
    out.mkdir()
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        ids = [f"gang-{i}" for i in range(3)]
        for job_id in ids:
            spec = job("gang", interval_pod(out, 1.5), replicas=8, gpu=1)
            assert (await client.submit(spec, job_id=job_id)).accepted
        results = [await client.wait(j, timeout_s=90) for j in ids]
    finally:
        await client.close()
    assert [r["state"] for r in results] == ["succeeded"] * 3
    rows = read_intervals(out)
    assert len(rows) == 24
    assert_no_gpu_overlap(rows)
    gangs: dict[str, list[dict]] = {}
    for r in rows:
        gangs.setdefault(r["pod"].rsplit("-", 1)[0], []).append(r)
    spans = {g: (min(r["start"] for r in rs), max(r["start"] for r in rs), min(r["end"] for r in rs),
                 max(r["end"] for r in rs)) for g, rs in gangs.items()}
    for g, (_first_start, last_start, first_end, _) in spans.items():
        assert last_start < first_end, f"{g}: a pod started after another had finished (partial gang)"
    # at most two gangs at any moment: the third started only after one of the first two ended
    order = sorted(spans.items(), key=lambda kv: kv[1][0])
    third_start = order[2][1][1]
    assert third_start >= min(order[0][1][3], order[1][1][3]) - 0.05


async def test_placer_killed_between_reserve_and_commit_leaves_no_claim(make_stack, tmp_path: Path) -> None:
    stack = make_stack(env={"placer": {"TIDE_FAULT_PAUSE_AFTER_RESERVE_S": "30", "TIDE_RESERVATION_TTL_S": "2"}})
    out = tmp_path / "pods"
    out.mkdir()
    client = await TideClient.connect(stack.info.settings_for("admin"))
    redis = Redis.from_url(stack.info.redis_url("placer"), decode_responses=True)
    try:
        assert (await client.submit(job("crash", interval_pod(out, 0.2), replicas=4, gpu=2),
                                    job_id="crash-gang")).accepted
        for _ in range(100):  # wait until the gang is reserved (and the placer stalls before starting it)
            if await redis.zcard(keys.RESERVATIONS):
                break
            await asyncio.sleep(0.05)
        assert await redis.scard(keys.CLAIMS_INDEX) == 4
        stack.kill("placer", signal.SIGKILL)
        await asyncio.sleep(2.5)  # the TTL lapses while no placer runs
        stack.restart("placer", env={"TIDE_FAULT_PAUSE_AFTER_RESERVE_S": "0"})
        status = await client.wait("crash-gang", timeout_s=60)
        assert status["state"] == "succeeded"
        assert status["attempts"] == 2
        assert len(read_intervals(out)) == 4  # every pod ran exactly once
        assert await redis.scard(keys.CLAIMS_INDEX) == 0
        assert await redis.zcard(keys.RESERVATIONS) == 0
        for node in ("node-0", "node-1"):
            used = await redis.hgetall(keys.used(node))
            assert all(int(v) == 0 for v in used.values()), used
    finally:
        await client.close()
        await redis.aclose()


async def test_agent_that_never_acknowledges_rolls_the_gang_back_and_it_runs_elsewhere(make_stack) -> None:
    stack = make_stack([default_h100_node("node-0"), default_h100_node("node-1")])
    client = await TideClient.connect(stack.info.settings_for("admin"))
    redis = Redis.from_url(stack.info.redis_url("placer"), decode_responses=True)
    try:
        blocker = job("blocker", ["sleep", "300"], replicas=1, gpu=8)
        assert (await client.submit(blocker, job_id="blocker")).accepted
        running = await client.wait("blocker", states={"running"}, timeout_s=30)
        busy = running["pods"][0]["node"]
        silent = "node-1" if busy == "node-0" else "node-0"
        stack.kill(f"agent-{silent}", signal.SIGKILL)  # registered, but nobody answers its commands
        assert (await client.submit(job("gang", ["true"], replicas=2, gpu=4), job_id="moved")).accepted
        for _ in range(100):
            status = await client.job("moved")
            if status["attempts"] >= 1 and "requeued" in status["reason"]:
                break
            await asyncio.sleep(0.1)
        assert silent in status["reason"] and "no acknowledgement" in status["reason"]
        assert all(int(v) == 0 for v in (await redis.hgetall(keys.used(silent))).values())
        await client.cancel("blocker")
        done = await client.wait("moved", timeout_s=60)
        assert done["state"] == "succeeded"
        assert {p["node"] for p in done["pods"]} == {busy}
    finally:
        await client.close()
        await redis.aclose()


async def test_two_placers_never_double_allocate(make_stack, tmp_path: Path) -> None:
    stack = make_stack([small_node(f"n{i}", gpus=8) for i in range(4)], placers=2)
    out = tmp_path / "pods"
    out.mkdir()
    client = await TideClient.connect(stack.info.settings_for("admin"))
    redis = Redis.from_url(stack.info.redis_url("placer"), decode_responses=True)
    checks = 0

    async def check_redis() -> None:
        nonlocal checks
        while True:
            for n in range(4):
                cap = await redis.hgetall(keys.capacity(f"n{n}"))
                used = await redis.hgetall(keys.used(f"n{n}"))
                for field, amount in used.items():
                    assert 0 <= int(amount) <= int(cap[field]), (n, field, amount)
            checks += 1
            await asyncio.sleep(0.05)

    checker = asyncio.create_task(check_redis())
    try:
        ids = []
        for i in range(200):
            ids.append(f"small-{i}")
            share = i % 3 == 0
            resources = {"gpuShare": {"memoryMiB": 20000, "smPercent": 40}} if share else {"gpu": 1}
            await client.submit(job("small", interval_pod(out, 0.05), **resources), job_id=ids[-1])
            if i % 10 == 0:
                ids.append(f"gang-{i}")
                await client.submit(job("gang", interval_pod(out, 0.1), replicas=4, gpu=2), job_id=ids[-1])
        results = [await client.wait(j, timeout_s=240) for j in ids]
    finally:
        checker.cancel()
        await client.close()
    assert not checker.done() or checker.cancelled()
    assert [r["state"] for r in results].count("succeeded") == 220
    rows = read_intervals(out)
    assert len(rows) == 200 + 20 * 4
    whole = [r for r in rows if not r["pod"].startswith("small-") or int(r["pod"].split("-")[1]) % 3]
    assert_no_gpu_overlap(whole)
    assert checks > 10
    placers = set()
    for name in ("placer", "placer-2"):
        text = (Path(stack.home) / "logs" / f"{name}.log").read_text()
        if '"gang_committed"' in text:
            placers.add(name)
    # one leader lease: exactly one of the two placers plans and binds (the other is its standby)
    assert len(placers) == 1, f"exactly one placer (the lease holder) should have placed work: {placers}"
    assert await redis.scard(keys.CLAIMS_INDEX) == 0
    await redis.aclose()


async def test_big_gang_is_not_starved_by_a_stream_of_small_jobs(make_stack) -> None:
    stack = make_stack([small_node("a", gpus=8), small_node("b", gpus=8)])
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        assert (await client.submit(job("first", ["sleep", "2"], gpu=1), job_id="first")).accepted
        await client.wait("first", states={"running"}, timeout_s=30)
        assert (await client.submit(job("big", ["sleep", "0.5"], replicas=2, gpu=8), job_id="big")).accepted
        stream = []
        for i in range(12):
            stream.append(f"small-{i}")
            assert (await client.submit(job("small", ["sleep", "1.5"], gpu=1), job_id=stream[-1])).accepted
            await asyncio.sleep(0.25)
        big = await client.wait("big", timeout_s=60)
        assert big["state"] == "succeeded"
        status = [await client.wait(j, timeout_s=60) for j in stream]
        first = await client.job("first")
        # the gang started as soon as the first job's GPU came back, before every small job behind it
        assert big["started_at"] < min(s["started_at"] for s in status)
        assert big["started_at"] >= first["finished_at"]
    finally:
        await client.close()


async def test_pending_gang_says_why(make_stack) -> None:
    nodes = [small_node(f"r{r}n{i}", gpus=4) for r in range(2) for i in range(2)]
    for node in nodes:
        node.rack = node.node_id[:2]
        node.labels["rack"] = node.rack
    stack = make_stack(nodes)
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        for rack in ("r0", "r1"):
            hold = job(f"hold-{rack}", ["sleep", "300"], gpu=3)
            hold["spec"]["template"]["nodeSelector"] = {"rack": rack}
            assert (await client.submit(hold, job_id=f"hold-{rack}")).accepted
            await client.wait(f"hold-{rack}", states={"running"}, timeout_s=30)
        spec = job("rack-gang", ["true"], replicas=6, gpu=1)
        spec["spec"]["topology"] = {"require": "rack"}
        assert (await client.submit(spec, job_id="rack-gang")).accepted
        for _ in range(50):
            status = await client.job("rack-gang")
            if "within one rack" in status["reason"]:
                break
            await asyncio.sleep(0.1)
        assert status["state"] == "pending"
        assert "needs 6 pods within one rack; the best rack has room for 5" in status["reason"]
        await client.cancel("hold-r1")
        done = await client.wait("rack-gang", timeout_s=60)
        assert done["state"] == "succeeded"
        assert {p["node"][:2] for p in done["pods"]} == {"r1"}  # all in the rack that freed up
    finally:
        await client.close()
