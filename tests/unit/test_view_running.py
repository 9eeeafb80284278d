"""The placer view's running set follows the claims as they come and go although it keeps its grouping of claims
by job and its entries between cycles (only the jobs whose claims or record changed are looked at again), hands
each cycle a map of its own, and finds the elastic jobs through the tally of the running jobs it keeps
(``ClusterView._running``, ``ClusterView.elastic``; issue 17: whole scans of the running jobs every cycle)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from redis.asyncio import Redis
from tide.core import Allocation
from tide.core.queues import QueueTree
from tide.schemas.events import JobRecord, JobState, PodRecord
from tide.schemas.job import JobSpec
from tide.settings import Settings
from tide.store import keys
from tide.store.claims import ClaimItem, ClaimStore, PodClaim
from tide.store.jobs import JobStore
from tide_placer import view as view_module
from tide_placer.service import PlacerService
from tide_placer.view import ClusterView

from tests.helpers import job, small_node

TREE = QueueTree.from_config(None)


def claim(job_id: str, index: int, node: str, gpu: int) -> PodClaim:
    alloc = Allocation(node_id=node, gpu_indices=(gpu,), gpu_milli=(1000,), gpu_mem_mib=(81920,), cpu_milli=1000)
    return PodClaim(job_id, f"{job_id}-{index}", (ClaimItem(node, f"g{gpu}.milli", 1000),
                                                 ClaimItem(node, "cpu", 1000)), alloc.to_dict())


async def two_nodes(redis: Redis) -> ClaimStore:
    """Two registered 2-GPU nodes, n0 and n1; their claim store."""
    claims = ClaimStore(redis)
    for n in ("n0", "n1"):
        await claims.set_capacity(small_node(n, gpus=2))
    return claims


async def store_record(redis: Redis, job_id: str, replicas: int = 1, min_member: int | None = None) -> None:
    body = job(job_id, ["sleep", "30"], gpu=1)
    body["spec"]["replicas"] = replicas
    if min_member is not None:
        body["spec"]["minMember"] = min_member
    record = JobRecord(job_id=job_id, spec=JobSpec.model_validate(body), submitted_at=0.0, updated_at=0.0,
                       state=JobState.RUNNING, pods=[PodRecord(name=f"{job_id}-{i}", index=i) for i in range(replicas)])
    await redis.set(keys.job(job_id), record.to_json())


async def test_the_running_set_follows_claims_and_elastic_jobs_are_found_by_index(
        redis: Redis, monkeypatch) -> None:
    monkeypatch.setattr(view_module, "freeze_long_lived", lambda: None)
    claims = await two_nodes(redis)
    await store_record(redis, "a", replicas=2)
    await store_record(redis, "el", replicas=2, min_member=1)  # one pod beyond its gang: elastic
    assert (await claims.claim([claim("a", 0, "n0", 0), claim("a", 1, "n1", 0)]))[0]
    assert (await claims.claim([claim("el", 0, "n0", 1)]))[0]
    view = ClusterView(redis, claims, resync_s=60.0)

    _, cluster, running = await view.refresh([])
    assert {j: len(allocs) for j, (_, allocs) in running.items()} == {"a": 2, "el": 1}
    assert set(view.elastic(running)) == {"el"}
    running.pop("a")  # a planner changing its cycle's map (the preempted jobs leave it)

    await store_record(redis, "b")
    assert (await claims.claim([claim("b", 0, "n1", 1)]))[0]
    _, _, running = await view.refresh([])
    assert {j: len(allocs) for j, (_, allocs) in running.items()} == {"a": 2, "el": 1, "b": 1}, "a new claim"

    await claims.release([keys.claim("a", "a-1")])
    _, cluster, running = await view.refresh([])
    assert {j: sorted(a.node_id for a in allocs) for j, (_, allocs) in running.items()} == {
        "a": ["n0"], "el": ["n0"], "b": ["n1"]}, "a claim gone"
    assert cluster.milli_free.sum() == 1000, "three of four GPUs held"

    _, _, again = await view.refresh([])  # nothing changed: the kept entries, in a map of its own
    assert again == running and again is not running
    assert view.tally.usage(TREE)["default"]["gpu"] == 4.0  # a: 2, el: its gang of 1, b: 1
    # a record this placer wrote replaces the job's entry, and the tally counts it again: a preempted job (stopping)
    # leaves its queue's usage
    stopping = running["b"][0].model_copy(update={"state": JobState.PREEMPTED})
    view.remember(stopping, stopping.to_json())
    _, _, running = await view.refresh([])
    assert running["b"][0] is stopping and running["a"] == again["a"]
    assert view.tally.usage(TREE)["default"]["gpu"] == 3.0

    await claims.release([keys.claim("el", "el-0")])
    _, _, running = await view.refresh([])
    assert set(running) == {"a", "b"} and view.elastic(running) == {}
    assert view.tally.elastic == set(), "a job that holds no claim leaves the tally"


async def test_a_kept_record_is_read_again_once_older_than_the_resync_period(redis: Redis) -> None:
    """Between resyncs only the records the view does not keep are read; once the oldest kept one is older than
    ``resync_s``, it is read again (and a record asked for alone is never older than that when returned)."""
    view = ClusterView(redis, ClaimStore(redis), resync_s=0.2)
    await store_record(redis, "r")
    [first] = await view.records(["r"])
    assert first is not None and first.reason == ""
    changed = first.model_copy(update={"reason": "changed in Redis by another placer"})
    await redis.set(keys.job("r"), changed.to_json())
    await store_record(redis, "s")
    kept, new = await view.records(["r", "s"])
    assert kept is first and new is not None, "a kept record younger than resync_s: not read; an unknown one: read"
    await asyncio.sleep(0.25)
    [again] = await view.records(["r"])
    assert again is not None and again.reason == "changed in Redis by another placer"
    [fresh] = await view.records(["s"])
    assert fresh is not None and fresh is not new, "'s' was kept as long: it is read again too"


async def test_an_idle_cycle_rebuilds_a_view_that_is_due_so_the_next_job_does_not_wait_for_it(
        redis: Redis, monkeypatch) -> None:
    """Issue 17: the view was rebuilt only in cycles with a job to place, so the first job after a quiet spell (or
    after the placer started) waited for the whole rebuild in its own cycle: 1,000 nodes read and built, ~130 ms,
    and one resync later the GC freeze, ~100 ms. A cycle with nothing pending now rebuilds a view that is due."""
    frozen: list[int] = []
    monkeypatch.setattr(view_module, "freeze_long_lived", lambda: frozen.append(1))
    await redis.flushdb()
    claims = await two_nodes(redis)
    svc = PlacerService(Settings(placer_resync_s=60.0))
    svc.redis, svc.claims = redis, claims
    svc.view = view = ClusterView(redis, claims, resync_s=60.0)
    svc._extras_wanted = False  # no running elastic job misses its extras: nothing to plan
    version = await redis.get(keys.NODES_VERSION)
    assert view.rebuild_due(version), "never built"
    await svc._place_pending()
    assert not view.rebuild_due(version) and {n.node_id for n in view.nodes} == {"n0", "n1"}
    built = view._built
    await svc._place_pending()
    assert view._built == built, "a view that is not due is left alone while idle"

    await claims.set_capacity(small_node("n2", gpus=2))  # a node registers
    version = await redis.get(keys.NODES_VERSION)
    assert view.rebuild_due(version)
    await svc._place_pending()
    assert not view.rebuild_due(version) and len(view.nodes) == 3
    view.invalidate()
    assert view.rebuild_due(version)
    view.resync_s = 0.0
    await svc._place_pending()
    assert view._built > built and frozen == [1], "nodes held still for a resync: frozen out of the GC, while idle"


async def test_claims_the_placer_noted_are_applied_without_a_read_and_stale_notes_are_dropped(
        redis: Redis, monkeypatch) -> None:
    monkeypatch.setattr(view_module, "freeze_long_lived", lambda: None)
    claims = await two_nodes(redis)
    for j in ("a", "b", "c"):
        await store_record(redis, j)
    view = ClusterView(redis, claims, resync_s=60.0)
    await view.refresh([])  # built: no claims yet
    reads: list[list[str]] = []
    real_pipeline = redis.pipeline

    def counted_pipeline(*args: object, **kwargs: object):  # what the view reads, one list per round trip
        pipe = real_pipeline(*args, **kwargs)  # type: ignore[arg-type]
        real_hget = pipe.hget
        reads.append([])

        def hget(key: str, field: str):  # type: ignore[no-untyped-def]
            reads[-1].append(key)
            return real_hget(key, field)

        pipe.hget = hget  # type: ignore[method-assign]
        return pipe

    a, b, c = claim("a", 0, "n0", 0), claim("b", 0, "n1", 1), claim("c", 0, "n1", 0)
    for taken in (a, b, c):
        assert (await claims.claim([taken]))[0]
    view.note_claims({a.key: Allocation.from_dict(a.alloc), b.key: Allocation.from_dict(b.alloc)})
    await claims.release([b.key])  # released before the view read the index: its note must not apply
    monkeypatch.setattr(redis, "pipeline", counted_pipeline)
    _, cluster, running = await view.refresh([])
    assert [k for r in reads for k in r] == [c.key]  # only the claim the placer did not note
    assert {j: [x.node_id for x in allocs] for j, (_, allocs) in running.items()} == {"a": ["n0"], "c": ["n1"]}
    assert cluster.milli_free.sum() == 2000
    assert view._noted == {}
    view.note_claims({a.key: Allocation.from_dict(a.alloc)})
    view.invalidate()  # e.g. leading again after another placer: the rebuild reads every claim, notes go
    assert view._noted == {}


async def test_a_cycle_reads_what_it_plans_with_in_its_reconcile_round_trip_unless_reconcile_changed_it(
        redis: Redis, monkeypatch) -> None:
    """Issue 17: the reconcile step and the placement step each read Redis at the start of every cycle; the
    placement step's reads now go in the reconcile step's round trip, and are made again only when that step
    changed something (here: a lapsed reservation released and its job rolled back)."""
    monkeypatch.setattr(view_module, "freeze_long_lived", lambda: None)
    await redis.flushdb()
    claims = await two_nodes(redis)
    svc = PlacerService(Settings(placer_resync_s=60.0))
    svc.redis, svc.claims, svc.jobs = redis, claims, JobStore(redis)
    svc.view = ClusterView(redis, claims, resync_s=60.0)
    svc.nc = SimpleNamespace(is_connected=True)  # type: ignore[assignment]
    svc._inherited, svc._extras_wanted = True, False
    rolled_back: list[str] = []

    async def rollback(job_id: str, attempt: int, why: str, bad_nodes: list[str] | None = None) -> None:
        rolled_back.append(f"{job_id}:{attempt}")

    svc._rollback = rollback  # type: ignore[method-assign]
    trips: list[int] = []
    real_pipeline = redis.pipeline

    def counted_pipeline(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        trips.append(1)
        return real_pipeline(*args, **kwargs)  # type: ignore[arg-type]

    await svc.cycle()  # the first builds the view
    monkeypatch.setattr(redis, "pipeline", counted_pipeline)
    await svc.cycle()
    assert len(trips) == 1, "nothing pending, nothing lapsed: one round trip for both steps"

    await store_record(redis, "a")
    await redis.set(keys.job("a"), (await svc.jobs.get("a")).model_copy(  # type: ignore[union-attr]
        update={"reservation": "a:1", "attempts": 1}).to_json())
    assert (await claims.reserve(
        [claim("a", 0, "n0", 0)], "a:1", 30_000))[0]
    await redis.zadd(keys.RESERVATIONS, {"a:1": 1})  # lapsed long ago
    svc._lapsing = None
    trips.clear()
    await svc.cycle()
    assert rolled_back == ["a:1"] and svc._lapsing == []
    assert len(trips) >= 2 and keys.claim("a", "a-0") not in svc.view.allocs, "read again after the lapse"
