"""The CLI's pure parts: reason codes, the timeline, inline specs, output columns, logs selection."""

from __future__ import annotations

import argparse
import io

import pytest
from tide.cli.describe import compact, reason_code, related_ids, timeline
from tide.cli.inline import default_name, describe_error, first_error, inline_spec
from tide.cli.logs import PodLog, Printer, select
from tide.cli.main import build_parser, split_wrapped
from tide.cli.output import duration, filter_jobs, job_gpus
from tide.schemas.events import JobEvent, JobState
from tide.schemas.job import JobSpec


@pytest.mark.parametrize(("kind", "state", "reason", "code"), [
    ("unschedulable", "unschedulable", "16 GPUs requested; the largest node has 8", "Unschedulable/InsufficientGPU"),
    ("unschedulable", "unschedulable", "no node matches selector pool=x", "Unschedulable/NodeSelectorMismatch"),
    ("unschedulable", "unschedulable", "128000m CPU requested; the largest eligible node has 32000m",
     "Unschedulable/InsufficientCPU"),
    ("unschedulable", "unschedulable", "no node has MIG profile 1g.10gb", "Unschedulable/InsufficientMIG"),
    ("", "pending", "0/2 nodes fit: 2 have less than 16000m CPU free", "Unschedulable/InsufficientCPU"),
    ("", "pending", "0/2 nodes fit: the others have fewer than 4 free GPUs", "Unschedulable/InsufficientGPU"),
    ("", "pending", "queue research at its limit: gpu 8 in use + 2 > 8", "QuotaExceeded"),
    ("", "pending", "not preemptible, so it may not borrow beyond its queue's guarantee: queue a has no guarantee",
     "QuotaExceeded/BeyondGuarantee"),
    ("", "pending", "2 GPU(s) are kept unlent by other queues' lendingLimit (4 free, 4 asked)",
     "QuotaExceeded/LendingLimit"),
    ("", "pending", "3/4 pods of the gang fit now; waiting for capacity (0/2 nodes fit)", "WaitingForGang"),
    ("", "pending", "needs 4 pods on one node; the best node has room for 2", "WaitingForGang"),
    ("", "pending", "preempting low-1 (priority online-serving)", "Nominated/Preempting"),
    ("", "pending", "", "Pending"),
    ("preempted", "preempted", "preempted by hi-1 (priority online-serving)", "Preempted"),
    ("requeued", "pending", "requeued after preemption by hi-1", "Requeued/Preempted"),
    ("requeued", "pending", "requeued: pod x-0 lost: node agent restarted without it", "Requeued/NodeLost"),
    ("failed", "failed", "pod x-0 OOM: CUDA out of memory", "Failed/OOM"),
    ("failed", "failed", "pod x-0 exited with code 5", "Failed/Error"),
    ("failed", "failed", "gang timeout: 2 of 4 pods could not be placed", "Failed/GangTimeout"),
    ("pod-exited", "running", "OOM", "PodExited/OOM"),
    ("queued", "pending", "", "Queued"),
    ("placed", "pending", "placed", "Reserved"),
    ("succeeded", "succeeded", "", "Succeeded"),
    ("rejected", "rejected", "spec.metadata.name: bad", "Rejected/InvalidSpec"),
    ("", "succeeded", "", "Succeeded"),
])
def test_reason_codes(kind: str, state: str, reason: str, code: str) -> None:
    assert reason_code(kind, state, reason) == code


def test_timeline_links_resubmissions_and_orders_by_time() -> None:
    events = [JobEvent(job_id="a", kind="failed", state=JobState.FAILED, reason="pod a-0 OOM", ts=20.0),
              JobEvent(job_id="a", kind="queued", state=JobState.PENDING, ts=10.0)]
    rows = timeline(events, {"job_id": "a", "state": "failed", "submitted_at": 9.0}, {"resubmitted_as": "a-r1"})
    assert [(r.code, r.text) for r in rows] == [
        ("Queued", "queued: queued in default (-)"), ("Failed/OOM", "failed: pod a-0 OOM"),
        ("Resubmitted", "resubmitted as a-r1")]
    assert related_ids("a") == {"resubmitted_as": "a-r1"}
    assert related_ids("a-r2") == {"resubmitted_as": "a-r3", "resubmission_of": "a-r1"}
    assert related_ids("a-r1")["resubmission_of"] == "a"
    started = JobEvent(event_id="a.pod-started.2.a-0", job_id="a", kind="pod-started", state=JobState.RUNNING,
                       pod="a-0", node="n1")
    assert timeline([started], None, {})[0].text == "pod-started: pod a-0 (attempt 2) on n1"
    assert compact({"a": None, "b": {}, "c": [], "d": {"e": 1, "f": None}}) == {"d": {"e": 1}}


def inline(*argv: str) -> dict:
    cut = argv.index("--")
    args = build_parser().parse_args(["submit", *argv[:cut]])
    return inline_spec(args, list(argv[cut + 1:]))


def test_inline_spec_is_the_spec_a_file_would_hold() -> None:
    spec = inline("--gpus", "2", "--replicas", "4", "--queue", "research/nlp", "--priority", "best-effort",
                  "--name", "ft", "--cpu", "8", "--memory", "64Gi", "--env", "A=1", "--selector", "pool=x",
                  "--gpu-model", "H100-80GB,A100-80GB", "--", "python", "train.py", "--lr", "3e-4")
    assert first_error(spec) is None
    job = JobSpec.model_validate(spec)
    assert job.metadata.name == "ft" and job.metadata.queue == "research/nlp"
    assert job.spec.replicas == 4 and job.spec.template.command == ["python", "train.py", "--lr", "3e-4"]
    r = job.spec.template.resources
    assert (r.gpu, r.cpu_milli, r.memory_mib, r.gpu_model) == (2, 8000, 65536, ["H100-80GB", "A100-80GB"])
    assert job.spec.template.env == {"A": "1"} and job.spec.template.node_selector == {"pool": "x"}
    share = JobSpec.model_validate(inline("--share-mem", "10Gi", "--share-sm", "30", "--", "x"))
    assert share.spec.template.resources.gpu_share is not None
    assert share.spec.template.resources.gpu_share.memory_mib == 10240
    assert JobSpec.model_validate(inline("--share-mem", "2048", "--", "x")).spec.template.resources.gpu_share
    assert JobSpec.model_validate(inline("--mig", "1g.10gb", "--", "x")).spec.template.resources.mig == "1g.10gb"


def test_inline_errors_name_field_and_flag() -> None:
    field, reason = first_error(inline("--gpus", "2", "--mig", "1g.10gb", "--", "x")) or ("", "")
    assert field == "spec.template.resources.mig" and "cannot be combined" in reason
    assert describe_error(field, reason).startswith("spec.template.resources.mig (--mig): ")
    field, _ = first_error(inline("--replicas", "0", "--", "x")) or ("", "")
    assert describe_error(field, "x") == "spec.replicas (--replicas): x"


def test_default_names_and_splitting_the_command() -> None:
    assert default_name(["python", "train.py", "--lr", "3e-4"]) == "train"
    assert default_name(["/usr/bin/python3.11", "-u", "scripts/Fine_Tune.py"]) == "fine-tune"
    assert default_name(["nvidia-smi"]) == "nvidia-smi"
    assert split_wrapped(["--home", "h", "submit", "--gpus", "2", "--", "python", "--", "x"]) == (
        ["--home", "h", "submit", "--gpus", "2"], ["python", "--", "x"])
    assert split_wrapped(["status", "--", "x"]) == (["status", "--", "x"], None)


def test_output_columns_and_filters() -> None:
    assert [duration(s) for s in (None, 5, 119, 600, 3600 * 3 + 60 * 20, 3600 * 24 * 5)] == [
        "-", "5s", "119s", "10m", "3h20m", "5d"]
    gpus = {"spec": {"replicas": 4, "template": {"resources": {"gpu": 2}}}}
    assert job_gpus(gpus) == "8"
    assert job_gpus({"spec": {"replicas": 2, "template": {"resources": {"mig": "1g.10gb"}}}}) == "2x1g.10gb"
    assert job_gpus({"spec": {"template": {"resources": {"gpuShare": {"memoryMiB": 1, "smPercent": 30}}}}}) == "1x30%"
    rows = [{"state": "running", "queue": "research/nlp"}, {"state": "pending", "queue": "research"},
            {"state": "running", "queue": "researchers"}]
    assert filter_jobs(rows, ["running"], ["research"]) == [rows[0]]
    assert filter_jobs(rows, [], ["research/nlp"]) == [rows[0]]


def test_logs_select_latest_attempts_and_prefix_whole_lines() -> None:
    found = [PodLog("j", "n0", "j-0.a1", "j-0", 1), PodLog("j", "n1", "j-0.a2", "j-0", 2),
             PodLog("j", "n0", "j-10.a1", "j-10", 1), PodLog("j", "n0", "j-2.a1", "j-2", 1)]
    assert [f.pod for f in select(found, None, None)] == ["j-0.a2", "j-2.a1", "j-10.a1"]
    assert [f.pod for f in select(found, "j-0", 1)] == ["j-0.a1"]
    assert [f.pod for f in select(found, "j-0.a1", None)] == ["j-0.a1"]
    out = io.BytesIO()
    printer = Printer(out, prefix=True)  # type: ignore[arg-type]
    printer.write(found[0], b"one\ntw")
    printer.write(found[0], b"o\nthree")
    printer.write(found[0], b"", final=True)
    assert out.getvalue() == b"[j-0] one\n[j-0] two\n[j-0] three\n"


def test_parser_keeps_json_flags() -> None:
    args = build_parser().parse_args(["status", "--json"])
    assert isinstance(args, argparse.Namespace) and args.json
