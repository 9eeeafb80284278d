"""The weights API as a tenant sees it (``tide.api.weights.<tenant>``, docs/security.md): the pure filter
(``tenant_weights``), the request parser, and the metrics service's read of Redis around the filter."""

from __future__ import annotations

import json
import time

from redis.asyncio import Redis
from tide.schemas.events import JobRecord
from tide.schemas.feedback import FamilyWeights
from tide.schemas.job import JobSpec
from tide.settings import Settings
from tide.store import keys
from tide.store.jobs import JobStore
from tide_metrics.feedback import (
    EVIDENCE_WITHHELD,
    HISTORY,
    HISTORY_LEN,
    FeedbackLoop,
    tenant_weights,
    weights_request,
)


def entry(job_id: str, family: str, kind: str = "clean") -> dict:
    return {"ts": 1.0, "family": family, "kind": kind, "job_id": job_id, "memory_multiplier": 1.5,
            "affinity": 0.0, "evidence": f"1 clean run(s) since the last OOM (last: job {job_id})"}


def fw(family: str, last_job: str | None) -> FamilyWeights:
    evidence = f"1 clean run(s) since the last OOM (last: job {last_job})" if last_job else ""
    return FamilyWeights(family=family, memory_multiplier=1.5, evidence=evidence, updated_at=1.0)


# newest first: bob's run of the shared family came last, so the shared family's evidence names bob's job
HISTORY_ = [entry("bob-s1", "shared"), entry("alice-s1", "shared"), entry("bob-b1", "fam-b"),
            entry("alice-a1", "fam-a"), entry("admin-x", "fam-x"), entry("gone-1", "fam-a")]
WEIGHTS = {"fam-a": fw("fam-a", "alice-a1"), "fam-b": fw("fam-b", "bob-b1"), "shared": fw("shared", "bob-s1"),
           "fam-x": fw("fam-x", "admin-x"), "fam-quiet": fw("fam-quiet", None)}
OWNERS = {"bob-s1": "bob", "alice-s1": "alice", "bob-b1": "bob", "alice-a1": "alice", "admin-x": None}


def test_a_tenant_sees_its_own_families_and_history_and_no_other_job_id() -> None:
    view = tenant_weights(WEIGHTS, HISTORY_, OWNERS, {"fam-a", "shared"}, "alice")
    assert [f["family"] for f in view["families"]] == ["fam-a", "shared"]
    assert [e["job_id"] for e in view["history"]] == ["alice-s1", "alice-a1"]  # newest first, as stored
    by_family = {f["family"]: f for f in view["families"]}
    assert "alice-a1" in by_family["fam-a"]["evidence"]  # its own job's change: shown
    assert by_family["shared"]["evidence"] == EVIDENCE_WITHHELD  # bob's change of a family they share: withheld
    assert by_family["shared"]["memory_multiplier"] == 1.5  # the weights themselves apply to its jobs too
    text = json.dumps(view)
    for other in ("bob", "admin-x", "gone-1", "fam-b", "fam-x"):
        assert other not in text, other


def test_the_other_tenant_sees_its_own() -> None:
    view = tenant_weights(WEIGHTS, HISTORY_, OWNERS, {"fam-b", "shared"}, "bob")
    assert [f["family"] for f in view["families"]] == ["fam-b", "shared"]
    assert all("bob" in f["evidence"] for f in view["families"])  # both last changes are its own
    assert [e["job_id"] for e in view["history"]] == ["bob-s1", "bob-b1"]
    assert "alice" not in json.dumps(view)


def test_a_family_of_its_history_is_its_own_even_outside_the_recent_jobs() -> None:
    view = tenant_weights(WEIGHTS, HISTORY_, OWNERS, set(), "alice")  # its jobs fell out of the recent window
    assert [f["family"] for f in view["families"]] == ["fam-a", "shared"]


def test_a_family_filter_and_the_limit() -> None:
    assert tenant_weights(WEIGHTS, HISTORY_, OWNERS, {"fam-a", "shared"}, "alice", family="fam-b") == {
        "families": [], "history": []}
    view = tenant_weights(WEIGHTS, HISTORY_, OWNERS, {"fam-a", "shared"}, "alice", family="shared", limit=5)
    assert [f["family"] for f in view["families"]] == ["shared"] and [e["job_id"] for e in view["history"]] == [
        "alice-s1"]
    assert len(tenant_weights(WEIGHTS, HISTORY_, OWNERS, {"fam-a"}, "alice", limit=1)["history"]) == 1
    assert tenant_weights(WEIGHTS, HISTORY_, OWNERS, {"fam-a"}, "alice", limit=-3)["history"] == []


def test_a_family_without_evidence_and_jobs_without_records() -> None:
    view = tenant_weights(WEIGHTS, HISTORY_, OWNERS, {"fam-quiet"}, "alice", family="fam-quiet")
    assert [(f["family"], f["evidence"]) for f in view["families"]] == [("fam-quiet", "")]
    # a job id with no record (owners lacks it), or an entry without a job id, is nobody's
    odd = [entry("gone-1", "fam-a"), {"family": "fam-a", "evidence": "x"}, {"job_id": 7, "family": "fam-a"}]
    assert tenant_weights(WEIGHTS, odd, OWNERS, set(), "alice") == {"families": [], "history": []}
    # a tenant's name never matches the admin's (None) jobs
    assert tenant_weights(WEIGHTS, HISTORY_, OWNERS, set(), "None")["history"] == []


def test_weights_request() -> None:
    assert weights_request(b"") == (None, 20)
    assert weights_request(None) == (None, 20)
    assert weights_request(b'{"family": "x", "limit": 3}') == ("x", 3)
    assert weights_request(b'{"limit": "7"}') == (None, 7)
    for bad in (b"not json", b"[1, 2]", b'"x"', b"\xff\xfe", b'{"family": ["x"], "limit": [1]}',
                b'{"limit": 1e999}', b'{"limit": NaN}'):
        assert weights_request(bad) == (None, 20), bad
    assert weights_request(b'{"limit": -5}') == (None, 0)
    assert weights_request(b'{"limit": 100000000}') == (None, HISTORY_LEN)


def record(job_id: str, family: str, owner: str | None) -> JobRecord:
    spec = JobSpec.model_validate({"metadata": {"name": job_id, "labels": {"family": family}},
                                   "spec": {"template": {"command": ["true"]}}})
    now = time.time()
    return JobRecord(job_id=job_id, spec=spec, submitted_at=now, updated_at=now, owner=owner)


async def test_the_service_reads_owners_and_families_from_redis(redis_url: str) -> None:
    """``api_weights_for`` on a real Redis: the owners come from the job records, the tenant's families from its
    recent jobs (a family it runs but never changed shows too), the shared answer is unchanged."""
    redis = Redis.from_url(redis_url, decode_responses=True)
    loop = FeedbackLoop(Settings(redis_url=redis_url), redis, None, None)  # type: ignore[arg-type]
    jobs = JobStore(redis)
    try:
        for r in (record("alice-a1", "fam-a", "alice"), record("alice-s1", "shared", "alice"),
                  record("alice-q1", "fam-quiet", "alice"), record("bob-b1", "fam-b", "bob"),
                  record("bob-s1", "shared", "bob"), record("admin-x", "fam-x", None)):
            assert await jobs.create(r, r.submitted_at)
        for w in WEIGHTS.values():
            await redis.hset(keys.WEIGHTS, w.family, w.model_dump_json())
        for e in reversed(HISTORY_):  # LPUSH: newest first
            await redis.lpush(HISTORY, json.dumps(e))

        alice = await loop.api_weights_for("alice", None)
        assert [f["family"] for f in alice["families"]] == ["fam-a", "fam-quiet", "shared"]
        assert [e["job_id"] for e in alice["history"]] == ["alice-s1", "alice-a1"]
        assert "bob" not in json.dumps(alice) and "admin-x" not in json.dumps(alice)
        assert (await loop.api_weights_for("alice", "fam-b"))["families"] == []
        carol = await loop.api_weights_for("carol", None)  # no jobs: nothing
        assert carol["families"] == [] and carol["history"] == []

        everything = await loop.api_weights(None, 50)  # the admin's shared subject: every family, every entry
        assert {f["family"] for f in everything["families"]} == set(WEIGHTS)
        assert [e["job_id"] for e in everything["history"]] == [e["job_id"] for e in HISTORY_]
    finally:
        await redis.aclose()
