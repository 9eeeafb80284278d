"""Job records on a real Redis: concurrent updates never lose a change."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from tide.schemas.events import JobRecord, PodRecord, PodState
from tide.schemas.job import JobSpec
from tide.store import keys
from tide.store.jobs import JobStore


async def test_concurrent_updates_all_apply(redis_url: str) -> None:
    clients = [Redis.from_url(redis_url, decode_responses=True) for _ in range(4)]
    try:
        stores = [JobStore(c) for c in clients]
        spec = JobSpec.model_validate({"metadata": {"name": "j"}, "spec": {"template": {"command": ["x"]}}})
        assert await stores[0].create(JobRecord(job_id="j", spec=spec, submitted_at=0, updated_at=0), 1.0)
        assert not await stores[1].create(JobRecord(job_id="j", spec=spec, submitted_at=0, updated_at=0), 1.0)

        def bump(r: JobRecord) -> bool:
            r.attempts += 1
            return True

        await asyncio.gather(*[stores[i % 4].update("j", bump) for i in range(60)])
        record = await stores[0].get("j")
        assert record is not None and record.attempts == 60
        assert await stores[0].update("j", lambda r: False) is None  # no change, no write
        assert await stores[0].update("missing", bump) is None
        assert [r.job_id if r else None for r in await stores[0].get_many(["j", "missing"])] == ["j", None]
    finally:
        for c in clients:
            await c.aclose()


async def test_change_from_a_known_record_never_trusts_it(redis_url: str) -> None:
    """A cached copy saves a read when it is current; when it is stale it decides nothing."""
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        store = JobStore(client)
        spec = JobSpec.model_validate({"metadata": {"name": "k"}, "spec": {"template": {"command": ["x"]}}})
        assert await store.create(JobRecord(job_id="k", spec=spec, submitted_at=0, updated_at=0), 1.0)
        stale = await client.get(keys.job("k"))

        def bump(r: JobRecord) -> bool:
            r.attempts += 1
            return True

        first = await store.change("k", bump, known=stale)
        assert first is not None and first[0].attempts == 1 and first[1] == await client.get(keys.job("k"))
        # the stale copy (attempts 0) is refused by compare-and-set: the change applies to the stored record
        second = await store.change("k", bump, known=stale)
        assert second is not None and second[0].attempts == 2
        # a change declined on the stale copy is asked again on the fresh one
        seen: list[int] = []

        def only_after_two(r: JobRecord) -> bool:
            seen.append(r.attempts)
            return r.attempts >= 2

        assert await store.change("k", only_after_two, known=stale) is not None
        assert seen[0] == 0 and seen[-1] == 2
        # dequeue leaves the pending set in the same step, and only when the write happens
        assert await store.pending() == ["k"]
        assert await store.change("k", lambda r: False, dequeue=True) is None
        assert await store.pending() == ["k"]
        assert await store.change("k", bump, dequeue=True) is not None
        assert await store.pending() == []
    finally:
        await client.aclose()


async def test_change_from_a_known_parsed_record_copies_it(redis_url: str, monkeypatch) -> None:
    """With the parsed record beside its JSON, the first try changes a copy of it (no parse) and leaves the
    caller's record as it was; a stale pair still decides nothing."""
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        store = JobStore(client)
        spec = JobSpec.model_validate({"metadata": {"name": "c"}, "spec": {"template": {"command": ["x"]}}})
        assert await store.create(JobRecord(job_id="c", spec=spec, submitted_at=0, updated_at=0,
                                            pods=[PodRecord(name="c-0", index=0)]), 1.0)
        raw = await client.get(keys.job("c"))
        kept = JobRecord.model_validate_json(raw)
        parses: list[str] = []
        parse = JobRecord.model_validate_json
        monkeypatch.setattr(JobRecord, "model_validate_json",
                            lambda data, **kw: parses.append(data) or parse(data, **kw))

        def place(r: JobRecord) -> bool:
            r.attempts += 1
            r.avoid_nodes.append("n9")
            r.pods[0].state = PodState.STARTING
            r.pods[0].gpus.append("GPU-1")
            return True

        result = await store.change("c", place, known=raw, known_record=kept)
        assert result is not None and parses == []
        record, new = result
        assert new == await client.get(keys.job("c")) and JobRecord.model_validate_json(new) == record
        assert (record.attempts, record.avoid_nodes, record.pods[0].gpus) == (1, ["n9"], ["GPU-1"])
        # the caller's record is untouched: it still parses from the old JSON
        assert kept == parse(raw) and kept.pods[0].state == PodState.PENDING and kept.pods[0].gpus == []
        # that pair is stale now: the compare-and-set refuses it, and the change applies to a fresh read
        again = await store.change("c", place, known=raw, known_record=kept)
        assert again is not None and again[0].attempts == 2 and len(parses) >= 1
    finally:
        await client.aclose()


def test_working_copy_equals_its_record_and_shares_nothing_a_change_edits() -> None:
    spec = JobSpec.model_validate({"metadata": {"name": "w"}, "spec": {"template": {"command": ["x"]}}})
    record = JobRecord(job_id="w", spec=spec, submitted_at=1.5, updated_at=2.5, avoid_nodes=["n1"],
                       pods=[PodRecord(name="w-0", index=0, node="n2", gpus=["GPU-a"], state=PodState.RUNNING)])
    copy = record.working_copy()
    assert copy == record and copy.to_json() == record.to_json()
    copy.pods[0].gpus.append("GPU-b")
    copy.pods[0].state = PodState.SUCCEEDED
    copy.pods.append(PodRecord(name="w-1", index=1))
    copy.avoid_nodes.append("n3")
    assert record.pods == [PodRecord(name="w-0", index=0, node="n2", gpus=["GPU-a"], state=PodState.RUNNING)]
    assert record.avoid_nodes == ["n1"]
