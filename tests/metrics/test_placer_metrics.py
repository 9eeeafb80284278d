"""The placer's own /metrics: what it derives from a plan (pure), and a live stack's placer scraped by a real
Prometheus through the scrape config `tide up` writes."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from tide.client import TideClient
from tide.core.cycle import CycleState
from tide.core.cycle_context import Bind, Plan, Preemption
from tide.core.model import Unfit
from tide.schemas.events import JobRecord, JobState
from tide.schemas.job import JobSpec
from tide.stack.launcher import PROMETHEUS_CONFIG, Stack
from tide.stack.servers import free_port, wait_tcp
from tide_placer.metrics import PlacerMetrics, pending_by_reason, preemption_reason

from tests.conftest import StackFactory
from tests.helpers import PY
from tests.metrics.conftest import fast_env
from tests.metrics.test_feedback_e2e import until
from tests.metrics.test_prometheus import job, query

SLEEP = [PY, "-c", "import time; time.sleep(300)"]


def record(job_id: str, queue: str = "default", state: JobState = JobState.PENDING, reason: str = "") -> JobRecord:
    spec = JobSpec.model_validate({"metadata": {"name": job_id, "queue": queue},
                                   "spec": {"template": {"command": ["x"], "resources": {"gpu": 1}}}})
    return JobRecord(job_id=job_id, spec=spec, state=state, reason=reason, submitted_at=0.0,
                     updated_at=0.0)


def state_of(pending: list[JobRecord]) -> CycleState:
    return CycleState(nodes=[], cluster=None, pending=pending, running={})  # type: ignore[arg-type]


def test_pending_jobs_by_queue_and_reason_code() -> None:
    jobs = [record("a"), record("b", "research"), record("c", "research"), record("d"),
            record("e", state=JobState.UNSCHEDULABLE, reason="0/2 nodes fit: the others have fewer than 8 free GPUs")]
    plan = Plan(binds=[Bind(jobs[0], [])],  # placed: no longer waits
                not_placed=[(jobs[1], Unfit("0/2 nodes fit: the others have fewer than 4 free GPUs", True)),
                            (jobs[2], Unfit("the whole cluster holds 16 GPUs; the job needs 24", False))],
                nominations={"d": "preempting v1 (priority online-serving)"})
    assert pending_by_reason(state_of(jobs), plan) == {
        ("research", "Unschedulable/InsufficientGPU"): 2,
        ("default", "Nominated/Preempting"): 1,
        ("default", "Unschedulable/InsufficientGPU"): 1,
    }


def test_preemption_reasons() -> None:
    assert preemption_reason("j", "priority online-serving") == "priority"
    assert preemption_reason("j", "reclaiming its queue's guarantee") == "guarantee"
    assert preemption_reason("j", "fair-share reclaim") == "fair_share"
    assert preemption_reason("tide", "tidal window night: training nodes go back") == "tide"
    assert preemption_reason("j", "its pool takes its lent nodes back") == "tide"
    assert preemption_reason("j", "consolidation: moved to make room for j; it fits again on n1") == "consolidation"
    assert preemption_reason("j", "something new") == "other"


def _value(metrics: PlacerMetrics, line_start: str) -> float:
    lines = [ln for ln in generate_latest(metrics.registry).decode().splitlines() if ln.startswith(line_start)]
    assert len(lines) == 1, lines
    return float(lines[0].rsplit(" ", 1)[1])


async def test_hooks_count_what_the_cycle_did() -> None:
    metrics = PlacerMetrics(lambda: {"n1": time.time() - 4.0})
    jobs = [record("a"), record("b")]
    plan = Plan(not_placed=[(jobs[0], Unfit("0/2 nodes fit: the others have fewer than 4 free GPUs", True))],
                preemptions=[Preemption("v", "b", "priority online-serving")])
    async with metrics.timed_cycle():
        metrics.observe_plan(state_of(jobs), plan)
        metrics.reservation(True)
        metrics.reservation(False)
    metrics.node_lost()
    assert _value(metrics, 'tide_placer_placement_attempts_total{otel_scope_name="tide.placer",otel_scope_schema_url'
                           '="",otel_scope_version="",result="unfit"}') == 1
    text = generate_latest(metrics.registry).decode()
    assert 'result="reserved"} 1.0' in text and 'result="conflict"} 1.0' in text
    assert 'reason="priority"} 1.0' in text
    assert 'queue="default",reason="Unschedulable/InsufficientGPU"} 1.0' in text
    assert 'queue="default",reason="Pending"} 1.0' in text  # b: waiting, no reason yet
    assert "tide_placer_cycle_duration_seconds_count" in text and "tide_placer_nodes_lost_total" in text
    assert 3.5 < _value(metrics, "tide_placer_node_heartbeat_age_seconds{node=\"n1\"") < 10
    async with metrics.timed_cycle():  # a cycle with nothing to plan: nothing waits
        pass
    assert "tide_placer_pending_jobs{" not in generate_latest(metrics.registry).decode()


def start_prometheus(tmp_path: Path, config: dict) -> tuple[subprocess.Popen[bytes], str]:
    """A real Prometheus on a free port with ``config``, scraping every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (CI installs Debian's prometheus package)")
    port = free_port()
    path = tmp_path / "prometheus.yml"
    path.write_text(json.dumps({**config, "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}}))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        [binary, f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    wait_tcp("127.0.0.1", port, timeout_s=20)
    return proc, f"http://127.0.0.1:{port}"


async def test_a_real_prometheus_scrapes_the_placer(make_stack: StackFactory, tmp_path: Path) -> None:
    env = fast_env(["node-0", "node-1"])
    env["placer"] = {"TIDE_NODE_LOST_AFTER_S": "3"}
    stack: Stack = make_stack(env=env)
    assert stack.info is not None and set(stack.info.placer_metrics_urls) == {"placer"}
    config = yaml.safe_load((Path(stack.info.home) / PROMETHEUS_CONFIG).read_text())  # what `tide up` wrote
    assert [c["job_name"] for c in config["scrape_configs"]] == ["tide-metrics", "tide-placer"]
    placer_target = config["scrape_configs"][1]["static_configs"][0]["targets"][0]
    assert stack.info.placer_metrics_urls["placer"] == f"http://{placer_target}/metrics"
    proc, base = start_prometheus(tmp_path, config)  # the generated scrape config, only faster
    client = await TideClient.connect(stack.info.settings_for("admin"))
    try:
        assert (await client.submit(job("fits", SLEEP, queue="default", gpu=1), job_id="fits")).accepted
        assert (await client.submit(job("too-big", SLEEP, queue="default", replicas=3, gpu=8),
                                    job_id="too-big")).accepted
        await client.wait("fits", states={"running"}, timeout_s=60)
        stack.kill("agent-node-1")  # silent from now on: lost after 3 s

        async def value(expr: str) -> float | None:
            rows = await asyncio.to_thread(query, base, expr)
            return max(float(r["value"][1]) for r in rows) if rows else None

        async def shows(expr: str) -> bool:
            return bool(await value(expr))

        await until(lambda: shows('up{job="tide-placer"}'), "the placer scraped", timeout_s=45)
        await until(lambda: shows('up{job="tide-metrics"}'), "the metrics service scraped", timeout_s=20)
        await until(lambda: shows("tide_placer_cycle_duration_seconds_count"), "cycles counted", timeout_s=30)
        await until(lambda: shows('tide_placer_placement_attempts_total{result="reserved"}'), "a reservation")
        await until(lambda: shows('tide_placer_placement_attempts_total{result="unschedulable"}'), "never fits")
        await until(lambda: shows('tide_placer_pending_jobs{queue="default",reason=~"Unschedulable.*"}'),
                    "the unschedulable job pending with its reason code")
        await until(lambda: shows("tide_placer_nodes_lost_total"), "node-1 lost", timeout_s=30)
        assert await value('tide_placer_node_heartbeat_age_seconds{node="node-1"}') >= 3  # type: ignore[operator]
        age = await value('tide_placer_node_heartbeat_age_seconds{node="node-0"}')
        assert age is not None and age < 3
        assert await value('count(tide_placer_preemptions_total)') == 6  # every reason has a series
        p99 = await value("histogram_quantile(0.99, tide_placer_cycle_duration_seconds_bucket)")
        assert p99 is not None and 0 < p99 < 30
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for job_id in ("fits", "too-big"):
            await client.cancel(job_id)
        await client.close()
