"""Fuzz every subject a service listens on, through one live stack (real NATS and Redis): job specs around the
real schema and raw bytes, as the users allowed to publish there. No process of the stack may exit, and a normal
job must still succeed afterwards."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from tide import subjects
from tide.client import TideClient
from tide.schemas.job import JOB_NAME_PATTERN
from tide.stack.auth import Tenant
from tide.stack.launcher import Stack

from tests.helpers import small_node
from tests.poison import (
    assert_all_alive,
    bad_registration,
    connect_as,
    dead_letters,
    hostile_specs,
    normal_job_succeeds,
    pids,
)

pytestmark = pytest.mark.timeout(240)
EXAMPLES = 60

# (user allowed to publish, subject, a reply inbox wanted: request/reply subjects)
TARGETS: list[tuple[str, str, bool]] = [
    ("admin", subjects.JOB_SUBMIT, False),
    ("admin", subjects.JOB_CANCEL, False),
    ("fuzzer", subjects.job_submit_as("fuzzer"), False),
    ("fuzzer", subjects.job_cancel_as("fuzzer"), False),
    ("node-n0", subjects.node_status("n0"), False),
    ("node-n0", subjects.telemetry("n0"), False),
    ("node-n0", subjects.heartbeat("n0"), False),
    ("queue", subjects.job_event("fuzz-event", "queued"), False),
    ("placer", subjects.job_event("fuzz-event", "placed"), False),
    ("placer", subjects.job_event("fuzz-event", "succeeded"), False),
    ("admin", subjects.PLACER_KICK, False),
    ("metrics", subjects.PLACER_WEIGHTS, False),
    ("admin", subjects.API_STATUS, True),
    ("fuzzer", subjects.api_status_as("fuzzer"), True),
    ("admin", subjects.API_QUEUES, True),
    ("admin", subjects.API_QUEUES_APPLY, True),
    ("admin", subjects.API_NODES, True),
    ("admin", subjects.API_WEIGHTS, True),
    ("fuzzer", subjects.api_weights_as("fuzzer"), True),
    ("admin", subjects.node_logs("n0"), True),
    ("placer", subjects.node_cmd("n0"), True),
]
USERS = sorted({u for u, _, _ in TARGETS})

# ------------------------------------------------------------ strategies: specs around the real schema
ints = st.one_of(st.integers(-2, 20), st.sampled_from([0, 1, 16, 17, 4096, 4097, 10**7, 2**31, 2**63, -(2**63)]))
floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, -1.0, 1e308, 3600.0]))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=24))
odd_text = st.text(max_size=40)  # any unicode, control characters and surrogates' neighbours included
levels = st.sampled_from(["nvlink", "pcie-switch", "numa", "node", "rack", "spine", "galaxy"])
# pods actually run: only commands that end at once (a nonexistent binary fails to start)
commands = st.sampled_from([["true"], ["false"], ["sleep", "0.2"], ["/nonexistent/tide-fuzz"]])

resources = st.fixed_dictionaries({}, optional={
    "gpu": st.one_of(ints, scalars),
    "cpuMilli": ints,
    "memoryMiB": ints,
    "mig": st.one_of(st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb", "9g.99gb"]), scalars),
    "gpuShare": st.fixed_dictionaries({}, optional={"memoryMiB": ints, "smPercent": ints}),
    "gpuModel": st.lists(st.one_of(st.sampled_from(["A100-80GB", "H100"]), odd_text), max_size=4),
    "nvidia.com/gpu": ints,
    "memory": st.one_of(st.sampled_from(["64Gi", "1", "-1Gi", "9999999Ti", "0.5Mi", "1e400"]), scalars),
    "cpu": st.one_of(st.sampled_from(["16", "500m", "0", "-1", "1e9"]), scalars),
    "nvidia.com/gpumem": ints,
    "nvidia.com/gpucores": ints,
})
template = st.fixed_dictionaries({"command": commands}, optional={
    "env": st.dictionaries(odd_text, odd_text, max_size=4),
    "resources": resources,
    "nodeSelector": st.dictionaries(st.one_of(st.just("pool"), odd_text), odd_text, max_size=3),
    "image": st.one_of(st.none(), odd_text),
})
body = st.fixed_dictionaries({"template": template}, optional={
    "replicas": ints,
    "minMember": ints,
    "topology": st.fixed_dictionaries({}, optional={"require": levels, "prefer": levels}),
    "gracePeriodSeconds": st.one_of(ints, floats),
    "runtimeSeconds": st.one_of(ints, floats),
    "preemptible": st.one_of(st.booleans(), scalars),
    "gangTimeoutSeconds": ints,
    "onTimeout": st.sampled_from(["fail", "shrink", "explode"]),
    "unknownField": scalars,
})
metadata = st.fixed_dictionaries({"name": st.one_of(st.from_regex(JOB_NAME_PATTERN, fullmatch=True), odd_text)},
                                 optional={
    "queue": st.one_of(st.sampled_from(["default", "a/b/c", "x" * 129, "Bad_Queue", "default/"]), odd_text),
    "priorityClass": st.sampled_from(["online-serving", "offline-training", "best-effort", "nope"]),
    "labels": st.dictionaries(odd_text, odd_text, max_size=3),
})


@st.composite
def job_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"metadata": draw(metadata), "spec": draw(body)}
    if draw(st.booleans()):
        spec["apiVersion"] = draw(st.sampled_from(["tide/v1", "tide/v2", 1]))
    replicas = spec["spec"].get("replicas")
    if isinstance(replicas, int) and replicas > 32:
        # a huge gang stays huge, but bound by GPUs: thousands of zero-resource pods would each be a process on
        # this test machine (a load test, not a fuzz test)
        spec["spec"]["template"]["resources"] = {"gpu": 1}
    return spec


raw_bytes = st.one_of(
    st.binary(max_size=512),
    st.sampled_from([b"", b"null", b"[]", b"[1,2]", b"{}", b'"x"', b"1e999", b"[" * 5000 + b"]" * 5000,
                     b'{"a":' * 3000 + b"1" + b"}" * 3000, b"\xff\xfe\x00", b'{"job_id": 5}', b'{"kind": "pod-exited"}',
                     b'{"schema_version": 1, "kind": "start", "job_id": "fuzz-x", "pod": "p", "command": ["true"]}']),
    st.text(max_size=200).map(str.encode),
)
header_values = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=70)


# ------------------------------------------------------------ the stack and the publishers
@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home: Path = tmp_path_factory.mktemp("fuzz") / "home"
    services = ("queue", "placer", "metrics")
    stack = Stack(home, [small_node("n0"), small_node("n1")], tenants=[Tenant("fuzzer", queues=["default"])],
                  env={name: {"TIDE_DEAD_LETTER_AFTER": "2"} for name in services})
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


class Publishers:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.loop = asyncio.new_event_loop()
        self.conns: dict[str, NATS] = {}
        self.job_ids: list[str] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def open(self) -> None:
        for user in USERS:
            self.conns[user] = await connect_as(self.stack, user)

    async def send(self, spec: dict[str, Any], raw: bytes, header: str | None) -> None:
        job_id = f"fuzz-{len(self.job_ids)}"
        self.job_ids.append(job_id)
        submit = json.dumps({"schema_version": 1, "job_id": job_id, "spec": spec}).encode()
        for user, subject, reply in TARGETS:
            nc = self.conns[user]
            for data in (submit if "jobs.submit" in subject else json.dumps(spec).encode(), raw):
                headers = {"Tide-Job-Id": header} if header is not None and "jobs." in subject else None
                await nc.publish(subject, data, reply=nc.new_inbox() if reply else "", headers=headers)
        for nc in self.conns.values():
            await nc.flush()

    async def close(self) -> None:
        for nc in self.conns.values():
            await nc.close()


def test_fuzz_every_subject_then_a_normal_job_runs(fuzz_stack: Stack) -> None:
    before = pids(fuzz_stack)
    pub = Publishers(fuzz_stack)
    pub.run(pub.open())

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(spec=job_specs(), raw=raw_bytes, header=st.one_of(st.none(), header_values))
    # the inputs that found crashes, always tried: a JSON list where an object is read (an order key's .get),
    # nesting deeper than json.loads recurses (once a handler raising on every delivery, now a rejection), an
    # inventory the planner cannot build (every placer cycle failing)
    @example(spec=hostile_specs()["elastic-4096"], raw=b"[1,2]", header=None)
    @example(spec=hostile_specs()["odd-unicode"], raw=b"[" * 5000 + b"]" * 5000, header="fuzz-deep")
    @example(spec=hostile_specs()["huge-gang"], raw=bad_registration(), header=None)
    def one(spec: dict[str, Any], raw: bytes, header: str | None) -> None:
        assert_all_alive(fuzz_stack, before)  # an earlier example's message may take a moment to land
        pub.run(pub.send(spec, raw, header))

    try:
        one()
        pub.run(asyncio.sleep(3.0))  # the last messages handled; failing ones redelivered and dead-lettered
        assert_all_alive(fuzz_stack, before)
        pub.run(_normal_job_after(fuzz_stack, pub.job_ids))
        assert_all_alive(fuzz_stack, before)
    finally:
        pub.run(pub.close())
        pub.loop.close()


async def _normal_job_after(stack: Stack, fuzz_jobs: list[str]) -> None:
    assert stack.info is not None
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        for job_id in fuzz_jobs:  # what the fuzz got accepted must not hold the GPUs the normal job needs
            await client.cancel(job_id)
        done = await normal_job_succeeds(client, "after-fuzz", timeout_s=60)
        assert done["state"] == "succeeded", done
        for letter, _ in await dead_letters(stack):  # whatever was given up says who gave it up and why
            assert letter.consumer and letter.subject and letter.error and letter.deliveries >= 2, letter
    finally:
        await client.close()
