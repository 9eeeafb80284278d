"""Invalid specs are rejected with the field and the reason; impossible ones are unschedulable."""

from __future__ import annotations

import json

import pytest
from tide import subjects
from tide.client import TideClient
from tide.schemas.events import JobRejected

from tests.helpers import job, py


def payload(spec: object, job_id: str, **extra: object) -> bytes:
    return json.dumps({"schema_version": 1, "job_id": job_id, "spec": spec, **extra}).encode()


BAD_SPECS = [
    ("negative-gpus", job("x", ["true"], gpu=-1), "spec.spec.template.resources.gpu", "greater than or equal to 0"),
    ("huge-gpus", job("x", ["true"], gpu=1e9), "spec.spec.template.resources.gpu", "less than or equal to 16"),
    ("unknown-mig", job("x", ["true"], mig="9g.99gb"), "spec.spec.template.resources.mig", "unknown MIG profile"),
    ("gpu-and-share", job("x", ["true"], gpu=1, gpuShare={"memoryMiB": 1024, "smPercent": 10}),
     "spec.spec.template.resources.gpuShare", "cannot be combined with gpu"),
    ("no-command", {"metadata": {"name": "x"}, "spec": {"template": {"command": []}}},
     "spec.spec.template.command", "at least 1 item"),
    ("bad-name", job("Not_A_Name", ["true"], gpu=1), "spec.metadata.name", "should match pattern"),
]


@pytest.mark.parametrize(("job_id", "spec", "field", "reason"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
async def test_invalid_spec_is_rejected_with_field_and_reason(
    client: TideClient, job_id: str, spec: dict, field: str, reason: str
) -> None:
    result = await client.submit(spec, job_id=job_id)
    assert not result.accepted
    assert result.field == field
    assert reason in result.reason
    status = await client.job(job_id)
    assert status is not None and status["state"] == "rejected"


async def test_min_member_above_replicas_is_rejected(client: TideClient) -> None:
    spec = job("x", ["true"], replicas=2, gpu=1)
    spec["spec"]["minMember"] = 3
    result = await client.submit(spec, job_id="gang-too-big")
    assert (result.accepted, result.field) == (False, "spec.spec.minMember")
    assert "minMember (3) must be <= replicas (2)" in result.reason


async def test_malformed_json_unknown_version_and_oversized_payloads(client: TideClient) -> None:
    rejected: list[JobRejected] = []

    async def on(msg) -> None:
        rejected.append(JobRejected.model_validate_json(msg.data))

    sub = await client.nc.subscribe(subjects.JOB_REJECTED, cb=on)
    malformed = await client.submit_raw(b'{"spec": {"metadata": ', "malformed")
    assert (malformed.accepted, malformed.field) == (False, "payload")
    assert "malformed JSON" in malformed.reason

    versioned = await client.submit_raw(payload(job("x", ["true"]), "future", schema_version=7), "future")
    assert (versioned.accepted, versioned.field) == (False, "schema_version")
    assert "unsupported schema_version 7" in versioned.reason

    big = job("x", ["echo", "y" * 100_000])
    oversized = await client.submit_raw(payload(big, "oversized"), "oversized")
    assert (oversized.accepted, oversized.field) == (False, "payload")
    assert "exceeds 65536" in oversized.reason
    await client.nc.flush()
    await sub.unsubscribe()
    # every rejection is also on the dead-letter subject with its reason
    assert {r.job_id for r in rejected} >= {"malformed", "future", "oversized"}


UNSCHEDULABLE = [
    ("no-such-pool", {"nodeSelector": {"pool": "inference"}}, {"gpu": 1}, "no node matches selector pool=inference"),
    ("too-many-gpus", {}, {"gpu": 12}, "12 GPUs requested; the largest node has 8"),
    ("gang-too-large", {"replicas": 3}, {"gpu": 8}, "gang of 3 x 8 GPU can never fit"),
    ("no-such-model", {}, {"gpu": 1, "gpuModel": ["B200"]}, "has GPUs of model B200"),
]


@pytest.mark.parametrize(("job_id", "extra", "resources", "why"), UNSCHEDULABLE, ids=[u[0] for u in UNSCHEDULABLE])
async def test_valid_but_impossible_job_is_unschedulable_with_why(
    client: TideClient, job_id: str, extra: dict, resources: dict, why: str
) -> None:
    spec = job(job_id, py("pass"), replicas=extra.get("replicas", 1), **resources)
    if "nodeSelector" in extra:
        spec["spec"]["template"]["nodeSelector"] = extra["nodeSelector"]
    result = await client.submit(spec, job_id=job_id)
    assert result.accepted
    status = await client.wait(job_id, timeout_s=30)
    assert status["state"] == "unschedulable"
    assert why in status["reason"]
