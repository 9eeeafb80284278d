"""The queue's pure validation: each bad input names its field and reason."""

from __future__ import annotations

import json

import pytest
from tide.schemas.events import JobRejected, SubmitJob
from tide_queue.validation import parse_submission

LIMIT = 64 * 1024


def spec(**resources: object) -> dict:
    return {"metadata": {"name": "j"}, "spec": {"template": {"command": ["true"], "resources": resources}}}


def parse(obj: object) -> SubmitJob | JobRejected:
    return parse_submission(json.dumps(obj).encode(), LIMIT)


def test_valid_submission_parses() -> None:
    result = parse({"schema_version": 1, "job_id": "abc", "spec": spec(gpu=2)})
    assert isinstance(result, SubmitJob)
    assert result.spec.spec.template.resources.gpu == 2
    assert result.spec.spec.gang_size == 1


def test_each_bad_field_is_named() -> None:
    cases = {
        "spec.spec.template.resources.gpu": spec(gpu=-1),
        "spec.spec.template.resources.mig": spec(mig="1g.3gb"),
        "spec.spec.template.resources.gpuShare.smPercent": spec(gpuShare={"memoryMiB": 10, "smPercent": 101}),
        "spec.spec.template.resources.cpuMilli": spec(cpuMilli=-5),
        "spec.metadata.priorityClass": {**spec(), "metadata": {"name": "j", "priorityClass": "vip"}},
        "spec.spec.template.resources.gpus": spec(gpus=1),
    }
    for field, body in cases.items():
        result = parse({"spec": body})
        assert isinstance(result, JobRejected), field
        assert result.field == field, (field, result)


def test_mig_with_share_is_rejected_on_mig() -> None:
    result = parse({"spec": spec(gpuShare={"memoryMiB": 10, "smPercent": 10}, mig="1g.10gb")})
    assert isinstance(result, JobRejected)
    assert result.field == "spec.spec.template.resources.mig" and "cannot be combined" in result.reason


def test_payload_level_rejections_keep_the_job_id_hint() -> None:
    oversized = parse_submission(b"x" * (LIMIT + 1), LIMIT, job_id_hint="big-one")
    assert isinstance(oversized, JobRejected)
    assert (oversized.job_id, oversized.field) == ("big-one", "payload")
    not_object = parse_submission(b"[1, 2]", LIMIT)
    assert isinstance(not_object, JobRejected) and "JSON object" in not_object.reason
    unsafe_hint = parse_submission(b"{", LIMIT, job_id_hint="a.b>c")
    assert isinstance(unsafe_hint, JobRejected) and unsafe_hint.job_id is None


def test_unknown_schema_version_is_rejected_before_the_spec() -> None:
    result = parse({"schema_version": "2", "spec": "not even a spec"})
    assert isinstance(result, JobRejected) and result.field == "schema_version"


def test_a_node_lease_shorter_than_two_heartbeats_is_refused() -> None:
    """The lease is renewed on each heartbeat: a lease of one heartbeat fences a healthy agent."""
    from pydantic import ValidationError
    from tide.settings import Settings

    with pytest.raises(ValidationError, match="TIDE_NODE_LEASE_S .* at least twice TIDE_HEARTBEAT_S"):
        Settings(node_lease_s=2.0, heartbeat_s=2.0)
    assert Settings(node_lease_s=2.0, heartbeat_s=0.5).node_lease_s == 2.0


def test_json_nested_too_deep_is_a_clean_rejection() -> None:
    """Nesting deeper than Python's JSON parser recurses is a rejection naming the payload, not a RecursionError
    in the queue's handler (which would be redelivered and dead-lettered)."""
    deep = parse_submission(b"[" * 5000 + b"]" * 5000, LIMIT, job_id_hint="deep-one")
    assert isinstance(deep, JobRejected)
    assert (deep.job_id, deep.field, deep.reason) == ("deep-one", "payload", "malformed JSON: nested too deep")
    inside = parse_submission(b'{"job_id": "x", "spec": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001, LIMIT)
    assert isinstance(inside, JobRejected) and inside.reason == "malformed JSON: nested too deep"


def test_a_submission_time_that_is_not_a_number_is_rejected() -> None:
    result = parse_submission(b'{"job_id": "nan-ts", "ts": NaN, "spec": ' + json.dumps(spec()).encode() + b"}", LIMIT)
    assert isinstance(result, JobRejected) and (result.job_id, result.field) == ("nan-ts", "ts")
