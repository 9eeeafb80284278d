"""Tenants on real NATS and Redis: each submits only to its queues and up to its priority class, and sees and
cancels only its own jobs; the admin sees all. `tide user add` adds one to a running stack."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from redis.asyncio import Redis
from tide import subjects
from tide.cli.main import main
from tide.client import TideClient
from tide.schemas.events import CancelJob
from tide.schemas.feedback import FamilyWeights
from tide.stack.auth import Tenant
from tide.stack.launcher import Stack
from tide.store import keys

from tests.helpers import job, py, small_node

TENANTS = [Tenant("alice", queues=["team-a"], max_priority="offline-training"),
           Tenant("bob", queues=["team-b"], max_priority="online-serving")]


def spec(name: str, queue: str, priority: str = "offline-training", gpu: int = 1, replicas: int = 1) -> dict:
    s = job(name, ["sleep", "300"], replicas=replicas, gpu=gpu)
    s["metadata"].update(queue=queue, priorityClass=priority)
    return s


@pytest.fixture
def tenant_stack(make_stack) -> Stack:
    return make_stack([small_node("n0", gpus=4)], tenants=TENANTS)


async def as_user(stack: Stack, user: str) -> TideClient:
    assert stack.info is not None
    return await TideClient.connect(stack.info.settings_for(user))


async def test_tenant_submits_only_to_its_queues_and_up_to_its_class(tenant_stack: Stack) -> None:
    alice = await as_user(tenant_stack, "alice")
    admin = await as_user(tenant_stack, "admin")
    try:
        other = await alice.submit(spec("x", "team-b"), job_id="alice-into-b")
        assert not other.accepted and other.field == "metadata.queue" and "team-b" in other.reason
        high = await alice.submit(spec("x", "team-a", "online-serving"), job_id="alice-high")
        assert not high.accepted and high.field == "metadata.priorityClass" and "offline-training" in high.reason
        sub = await alice.submit(spec("x", "team-a/sub"), job_id="alice-sub")  # a sub-queue of its own
        assert sub.accepted, sub
        ok = await alice.submit(spec("x", "team-a", "best-effort"), job_id="alice-ok")
        assert ok.accepted, ok
        record = (await admin.status("alice-ok"))["jobs"][0]
        assert record["owner"] == "alice"
    finally:
        await alice.close()
        await admin.close()


async def test_tenant_sees_and_cancels_only_its_own_jobs(tenant_stack: Stack) -> None:
    alice = await as_user(tenant_stack, "alice")
    bob = await as_user(tenant_stack, "bob")
    admin = await as_user(tenant_stack, "admin")
    try:
        assert (await bob.submit(spec("b", "team-b", "online-serving"), job_id="bob-1")).accepted
        assert (await alice.submit(spec("a", "team-a"), job_id="alice-1")).accepted
        assert (await admin.submit(spec("c", "default"), job_id="admin-1")).accepted
        await bob.wait("bob-1", states={"running", "pending"}, timeout_s=20)
        # alice cannot see bob's job, nor the admin's; her list holds only hers
        assert await alice.job("bob-1") is None
        assert await alice.job("admin-1") is None
        assert [j["job_id"] for j in (await alice.status())["jobs"]] == ["alice-1"]
        assert {j["job_id"] for j in (await admin.status())["jobs"]} >= {"bob-1", "alice-1", "admin-1"}
        # alice's cancel of bob's job is refused by the queue; bob's own works
        await alice.cancel("bob-1")
        await asyncio.sleep(1.0)
        assert (await admin.job("bob-1"))["state"] not in ("cancelled",)
        assert not (await admin.status("bob-1"))["jobs"][0]["cancel_requested"]
        # nor can she reuse bob's job id, or spoil its status with a rejection under that id
        reuse = await alice.submit(spec("b", "team-a"), job_id="bob-1")
        assert not reuse.accepted and reuse.field == "job_id"
        assert (await bob.job("bob-1"))["state"] != "rejected"
        await bob.cancel("bob-1")
        done = await bob.wait("bob-1", states={"cancelled"}, timeout_s=30)
        assert done["state"] == "cancelled"
    finally:
        for c in (alice, bob, admin):
            await c.close()


async def test_tenant_cannot_use_admin_or_other_tenants_subjects(tenant_stack: Stack) -> None:
    info = tenant_stack.info
    assert info is not None
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(info.nats_url, user="alice", password=info.passwords["alice"], error_cb=on_error,
                            inbox_prefix="_INBOX_alice", max_reconnect_attempts=0)
    try:
        # the read paths a tenant must not take itself: other tenants' status/history/logs subjects, a node's logs
        # subject, and the EVENTS and DLQ streams (per-job subjects, consumers, single messages)
        # (and the shared weights subject, whose history names every tenant's jobs, and another's weights subject)
        denied_publish = ("tide.jobs.submit", "tide.jobs.submit.bob", "tide.jobs.cancel.bob", "tide.api.status.bob",
                          "tide.api.history.bob", "tide.api.logs.bob", "tide.api.history", "tide.api.logs",
                          "tide.api.weights", "tide.api.weights.bob",
                          "tide.node.n0.logs", "tide.api.queues.apply", "$js.api.stream.info.jobs",
                          "$js.api.stream.msg.get.events", "$js.api.direct.get.events",
                          "$js.api.consumer.create.events", "$js.api.stream.msg.get.dlq")
        for subject in (subjects.JOB_SUBMIT, subjects.job_submit_as("bob"), subjects.JOB_CANCEL,
                        subjects.job_cancel_as("bob"), subjects.API_STATUS, subjects.api_status_as("bob"),
                        subjects.api_history_as("bob"), subjects.api_logs_as("bob"), subjects.API_HISTORY,
                        subjects.API_LOGS, subjects.API_WEIGHTS, subjects.api_weights_as("bob"),
                        subjects.node_logs("n0"), subjects.API_QUEUES_APPLY,
                        "$JS.API.STREAM.INFO.JOBS", "$JS.API.STREAM.MSG.GET.EVENTS", "$JS.API.DIRECT.GET.EVENTS",
                        "$JS.API.CONSUMER.CREATE.EVENTS", "$JS.API.STREAM.MSG.GET.DLQ"):
            await nc.publish(subject, b"{}")
        denied_subscribe = (subjects.EVENTS_ALL, subjects.job_events("bob-1"), subjects.DLQ_ALL,
                            subjects.NODE_LOGS_ALL, subjects.API_WEIGHTS, subjects.API_WEIGHTS_TENANTS, "_INBOX.>")
        for subject in denied_subscribe:
            await nc.subscribe(subject)
        await nc.flush()
        for _ in range(100):
            if len(errors) >= len(denied_publish) + len(denied_subscribe) + 1:
                break
            await asyncio.sleep(0.05)
        text = " ".join(str(e) for e in errors).lower()
        for subject in denied_publish:
            assert f'permissions violation for publish to "{subject}"' in text, subject
        for subject in denied_subscribe:
            assert f'permissions violation for subscription to "{subject.lower()}"' in text, subject
        # a cancel forged for bob's subject never reaches the stream
        admin = await nats.connect(info.nats_url, user="admin", password=info.passwords["admin"])
        try:
            forged = CancelJob(job_id="anything", reason="forged")
            await nc.publish(subjects.job_cancel_as("bob"), forged.to_bytes())
            await nc.flush()
            await asyncio.sleep(0.2)
            stream = await admin.jetstream().stream_info("JOBS", subjects_filter=subjects.JOB_CANCEL_TENANTS)
            assert not stream.state.subjects
        finally:
            await admin.close()
    finally:
        await nc.close()


async def test_user_add_on_a_running_stack(tenant_stack: Stack, capsys) -> None:
    home = str(tenant_stack.home)
    assert await asyncio.to_thread(main, ["--home", home, "user", "add", "carol", "--queues", "team-c,shared",
                 "--max-priority", "best-effort"]) == 0
    assert await asyncio.to_thread(main, ["--home", home, "user", "add", "admin", "--queues", "x"]) == 2  # reserved
    assert await asyncio.to_thread(
        main, ["--home", home, "user", "add", "dave", "--queues", "x", "--max-priority", "urgent"]) == 2
    stack_json = json.loads((tenant_stack.home / "stack.json").read_text())
    assert "carol" in stack_json["tenants"] and stack_json["passwords"]["carol"]
    for _ in range(50):  # the NATS server reloads its config on SIGHUP
        try:
            carol = await TideClient.connect(
                tenant_stack.info.settings_for("admin").model_copy(
                    update={"nats_user": "carol", "nats_password": stack_json["passwords"]["carol"], "user": "carol"}))
            break
        except Exception:
            await asyncio.sleep(0.1)
    try:
        ok = await carol.submit(spec("c", "shared", "best-effort"), job_id="carol-1")
        assert ok.accepted, ok
        refused = await carol.submit(spec("c", "shared"), job_id="carol-2")
        assert not refused.accepted and refused.field == "metadata.priorityClass"
    finally:
        await carol.close()
    capsys.readouterr()
    # the CLI acts as a tenant with --user
    assert await asyncio.to_thread(main, ["--home", home, "--user", "carol", "status", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["jobs"] if isinstance(out, dict) else out
    assert [r["job_id"] for r in rows] == ["carol-1"]
    assert await asyncio.to_thread(main, ["--home", home, "--user", "nobody", "status"]) == 2


async def test_pending_limits(make_stack) -> None:
    env = {"queue": {"TIDE_MAX_PENDING_PER_QUEUE": "3", "TIDE_MAX_PENDING_PER_TENANT": "2"}}
    stack = make_stack([small_node("n0", gpus=2)], env=env, tenants=[Tenant("alice", queues=["team-a", "team-x"])])
    alice = await as_user(stack, "alice")
    admin = await as_user(stack, "admin")
    try:  # 8 GPUs per pod on a 2-GPU node: they stay pending
        for i in range(2):
            assert (await alice.submit(spec("a", "team-a", gpu=8), job_id=f"a-{i}")).accepted
        over = await alice.submit(spec("a", "team-x", gpu=8), job_id="a-2")
        assert not over.accepted and over.field == "tenant" and "2 pending" in over.reason
        for i in range(3):
            assert (await admin.submit(spec("q", "team-q", gpu=8), job_id=f"q-{i}")).accepted
        full = await admin.submit(spec("q", "team-q", gpu=8), job_id="q-3")
        assert not full.accepted and full.field == "metadata.queue" and "team-q" in full.reason
        assert (await admin.submit(spec("q", "team-r", gpu=8), job_id="r-0")).accepted  # another queue
        await admin.cancel("a-0")
        await admin.wait("a-0", states={"cancelled"}, timeout_s=20)
        assert (await alice.submit(spec("a", "team-x", gpu=8), job_id="a-3")).accepted  # room again
    finally:
        await alice.close()
        await admin.close()


def run_cli(home: str, capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--home", home, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def talker(name: str, line: str) -> dict:
    """A job that prints ``line`` and then stays running."""
    s = job(name, py(f"import time; print({line!r}, flush=True); time.sleep(300)"), gpu=1)
    s["metadata"]["queue"] = "team-a" if name.startswith("alice") else "team-b"
    return s


async def test_tenant_reads_only_its_own_jobs_on_every_read_path(tenant_stack: Stack, capsys) -> None:
    """status, the job list, describe (events and dead letters), logs, wait and watch, through the CLI and the
    wire: a tenant reads its own jobs, never another's; the admin reads all."""
    alice = await as_user(tenant_stack, "alice")
    bob = await as_user(tenant_stack, "bob")
    home = str(tenant_stack.home)
    try:
        assert (await bob.submit(talker("bob-1", "bob-secret-output"), job_id="bob-1")).accepted
        assert (await alice.submit(talker("alice-1", "alice-output"), job_id="alice-1")).accepted
        for client, job_id in ((bob, "bob-1"), (alice, "alice-1")):
            await client.wait(job_id, states={"running"}, timeout_s=30)

        def cli(*argv: str) -> tuple[int, str, str]:
            return run_cli(home, capsys, *argv)

        # status and the job list
        code, out, err = await asyncio.to_thread(cli, "--user", "alice", "status", "bob-1")
        assert code == 1 and "no job 'bob-1'" in err and "bob" not in out
        code, out, _ = await asyncio.to_thread(cli, "--user", "alice", "status", "--json")
        assert code == 0 and [r["job_id"] for r in json.loads(out)] == ["alice-1"]
        # describe: the tenant's own job with its events (read by the queue for it), not another's
        code, out, err = await asyncio.to_thread(cli, "--user", "alice", "describe", "alice-1")
        assert code == 0, err
        assert "Queued" in out and "Running" in out and "(none kept in the EVENTS stream)" not in out, out
        code, out, err = await asyncio.to_thread(cli, "--user", "alice", "describe", "bob-1", "-o", "json")
        assert code == 1 and "no job 'bob-1'" in err and out == "", (out, err)
        # logs: the tenant's own pods' output, through the queue; another's job is "no job"
        code, out, err = await asyncio.to_thread(cli, "--user", "alice", "logs", "alice-1")
        assert code == 0 and "alice-output" in out, (out, err)
        code, out, err = await asyncio.to_thread(cli, "--user", "alice", "logs", "bob-1")
        assert code == 1 and "no job 'bob-1'" in err and "bob-secret-output" not in out
        # watch streams every job's events: the admin's only, said plainly
        code, _, err = await asyncio.to_thread(cli, "--user", "alice", "watch")
        assert code == 2 and "admin" in err
        # wait: another's job never shows
        with pytest.raises(TimeoutError):
            await alice.wait("bob-1", timeout_s=1.5)
        assert [e.kind for e in await alice.job_history("bob-1")] == []

        # the wire: the queue answers a tenant's history and logs requests only for its own jobs
        history = await alice.request(subjects.API_HISTORY, json.dumps({"job_id": "bob-1"}).encode())
        assert history["events"] == [] and history["dead_letters"] == [] and "no job" in history["error"]
        pod = (await bob.job("bob-1"))["pods"][0]
        node = pod["node"]
        for request in ({"job_id": "bob-1"}, {"job_id": "bob-1", "pod": f"{pod['name']}.a1"}):
            reply = await alice.request(subjects.API_LOGS, json.dumps({"node": node, "request": request}).encode())
            assert reply == {"ok": False, "error": "no job 'bob-1'"}, reply
        # its own job's id cannot reach another job's files either (the agent reads <job>/<pod> names only)
        sneaky = {"job_id": "alice-1", "pod": f"{pod['name']}.a1"}
        reply = await alice.request(subjects.API_LOGS, json.dumps({"node": node, "request": sneaky}).encode())
        assert not reply["ok"] and "bob-secret-output" not in json.dumps(reply)
        for request in ({"job_id": "alice-1", "pod": "../bob-1/bob-1-0.a1"}, {"job_id": "../bob-1"}):
            reply = await alice.request(subjects.API_LOGS, json.dumps({"node": node, "request": request}).encode())
            assert not reply["ok"], reply
        bad_node = await alice.request(subjects.API_LOGS, json.dumps({"node": "*", "request": {"job_id": "alice-1"}})
                                       .encode())
        assert bad_node == {"ok": False, "error": "bad node '*'"}

        # the admin sees everything
        code, out, _ = await asyncio.to_thread(cli, "describe", "bob-1")
        assert code == 0 and "Job:        bob-1" in out and "Running" in out
        code, out, _ = await asyncio.to_thread(cli, "logs", "bob-1")
        assert code == 0 and "bob-secret-output" in out
    finally:
        for c in (alice, bob):
            await c.close()


def family_job(name: str, family: str) -> dict:
    """A job of ``family`` that ends at once, in its tenant's queue."""
    s = job(name, ["true"], gpu=1)
    s["metadata"].update(queue="team-a" if name.startswith("alice") else "team-b", labels={"family": family})
    return s


async def test_tenant_sees_only_its_own_feedback_weights(tenant_stack: Stack, capsys) -> None:
    """The feedback weights (tide.api.weights.<tenant>): a tenant sees the families of its own jobs and the changes
    its own jobs caused, never another tenant's job ids or families (nor the evidence of another's change of a
    family they share); the admin sees everything on tide.api.weights. Through the metrics service's own
    feedback loop: each clean run of a family with a raised multiplier is a logged change naming the job."""
    from tests.metrics.test_feedback_e2e import until

    info = tenant_stack.info
    assert info is not None
    redis = Redis.from_url(info.redis_url("metrics"), decode_responses=True)
    alice = await as_user(tenant_stack, "alice")
    bob = await as_user(tenant_stack, "bob")
    admin = await as_user(tenant_stack, "admin")
    home = str(tenant_stack.home)
    try:
        for family in ("fam-a", "fam-b", "fam-shared"):
            raised = FamilyWeights(family=family, memory_multiplier=1.5, evidence="raised by the test")
            await redis.hset(keys.WEIGHTS, family, raised.model_dump_json())

        async def logged(job_id: str) -> bool:
            return job_id in {e["job_id"] for e in (await admin.weights(limit=50))["history"]}

        # bob's and alice's jobs, then bob's run of the family they share last: its evidence names bob's job
        for client, job_id, family in ((bob, "bob-b1", "fam-b"), (alice, "alice-a1", "fam-a"),
                                       (alice, "alice-s1", "fam-shared"), (bob, "bob-s1", "fam-shared")):
            assert (await client.submit(family_job(job_id, family), job_id=job_id)).accepted
            assert (await client.wait(job_id, timeout_s=60))["state"] == "succeeded"
            await until(lambda job_id=job_id: logged(job_id), f"the feedback change of {job_id}")

        # the admin, on the shared subject: every family and every change
        everything = await admin.weights(limit=50)
        assert {"fam-a", "fam-b", "fam-shared"} <= {f["family"] for f in everything["families"]}
        assert {"bob-b1", "alice-a1", "alice-s1", "bob-s1"} <= {e["job_id"] for e in everything["history"]}
        assert "bob-s1" in {f["family"]: f for f in everything["families"]}["fam-shared"]["evidence"]

        # alice, on her own subject: her families, her jobs' changes, no job id or family of bob's
        mine = await alice.weights(limit=50)
        assert [f["family"] for f in mine["families"]] == ["fam-a", "fam-shared"], mine
        assert [e["job_id"] for e in mine["history"]] == ["alice-s1", "alice-a1"], mine
        shared = {f["family"]: f for f in mine["families"]}["fam-shared"]
        assert shared["memory_multiplier"] > 1 and "withheld" in shared["evidence"]  # bob's change: not shown
        assert "bob" not in json.dumps(mine) and "fam-b" not in json.dumps(mine)
        other = await alice.weights("fam-b")
        assert other["families"] == [] and other["history"] == [], other
        # bob's view is the mirror image
        his = await bob.weights(limit=50)
        assert [f["family"] for f in his["families"]] == ["fam-b", "fam-shared"]
        assert [e["job_id"] for e in his["history"]] == ["bob-s1", "bob-b1"]
        assert "alice" not in json.dumps(his) and "fam-a" not in json.dumps(his)

        # the CLI as alice: the status footer and a job's family
        code, out, err = await asyncio.to_thread(run_cli, home, capsys, "--user", "alice", "status")
        assert code == 0 and "fam-a" in out and "fam-shared" in out, (out, err)
        assert "bob" not in out and "fam-b" not in out, out
        code, out, err = await asyncio.to_thread(run_cli, home, capsys, "--user", "alice", "status", "alice-s1",
                                                 "--json")
        assert code == 0 and json.loads(out)["feedback"]["family"] == "fam-shared" and "bob" not in out, (out, err)
        code, out, _ = await asyncio.to_thread(run_cli, home, capsys, "status")  # the admin's footer: bob's too
        assert code == 0 and "fam-b" in out and "bob-s1" in out, out

        # her raw request on the shared subject, or on bob's, is a permissions violation: no answer
        for subject in (subjects.API_WEIGHTS, subjects.api_weights_as("bob")):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await alice.nc.request(subject, b"{}", timeout=1)
    finally:
        for c in (alice, bob, admin):
            await c.close()
        await redis.aclose()


async def test_oom_resubmission_keeps_its_tenant(make_stack) -> None:
    """The feedback loop resubmits a tenant's OOM-failed job as that tenant: the tenant sees and cancels the
    resubmission, another tenant does not see it, and the queue counts it as the tenant's (its owner) for the
    tenant's pending limit."""
    from tests.metrics.conftest import fast_env
    from tests.metrics.test_feedback_e2e import share_job

    stack = make_stack(env=fast_env(["node-0", "node-1"]),
                       tenants=[Tenant("alice", queues=["default"]), Tenant("bob", queues=["default"])])
    alice = await as_user(stack, "alice")
    bob = await as_user(stack, "bob")
    admin = await as_user(stack, "admin")
    try:
        spec_ = share_job("oomy", 11264)
        spec_["spec"]["template"]["env"]["HOLD_S"] = "300"  # once it fits, it keeps running (and pending counts)
        spec_["spec"]["template"]["command"][-1] += "\nimport time; time.sleep(int(os.environ['HOLD_S']))\n"
        assert (await alice.submit(spec_, job_id="oomy-1")).accepted
        first = await alice.wait("oomy-1", timeout_s=60)
        assert first["state"] == "failed" and "OOM" in first["reason"], first
        second = await alice.wait("oomy-1-r1", states={"running"}, timeout_s=60)  # alice sees it
        assert (await admin.status("oomy-1-r1"))["jobs"][0]["owner"] == "alice"
        assert await bob.job("oomy-1-r1") is None
        code = await asyncio.to_thread(main, ["--home", str(stack.home), "--user", "alice", "describe", "oomy-1"])
        assert code == 0
        await alice.cancel("oomy-1-r1")  # and cancels it
        assert (await alice.wait("oomy-1-r1", states={"cancelled"}, timeout_s=30))["state"] == "cancelled"
        assert second["job_id"] == "oomy-1-r1" and second["state"] == "running"
    finally:
        for c in (alice, bob, admin):
            await c.close()
