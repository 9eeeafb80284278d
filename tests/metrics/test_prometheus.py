"""A real Prometheus server scrapes the metrics service during a short simulated run, and every panel
expression of the dashboard returns at least one series."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from tide.client import TideClient
from tide.stack.launcher import Stack
from tide.stack.servers import free_port, wait_tcp

from tests.helpers import PY
from tests.metrics.test_dashboard import panel_queries
from tests.metrics.test_feedback_e2e import share_job, until

SLEEP = [PY, "-c", "import time; time.sleep(300)"]


def start_prometheus(tmp_path: Path, target: str) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (CI installs Debian's prometheus package)")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "tide-metrics", "static_configs": [{"targets": [target]}]}],
    }))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    wait_tcp("127.0.0.1", port, timeout_s=20)
    return proc, f"http://127.0.0.1:{port}"


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def job(name: str, command: list[str], queue: str = "research/nlp", priority: str = "offline-training",
        replicas: int = 1, **resources: object) -> dict:
    return {"metadata": {"name": name, "queue": queue, "priorityClass": priority},
            "spec": {"replicas": replicas, "template": {"command": command, "resources": resources}}}


async def test_every_dashboard_panel_returns_a_series_from_a_real_prometheus(
    fast_stack: Stack, fast_client: TideClient, tmp_path: Path
) -> None:
    assert fast_stack.info is not None
    metrics = urlparse(fast_stack.info.metrics_url)
    proc, base = start_prometheus(tmp_path, f"{metrics.hostname}:{metrics.port}")
    client = fast_client
    try:
        runs = [
            ("whole", job("whole", SLEEP, gpu=1)),
            ("shared", job("shared", SLEEP, queue="serving", priority="online-serving",
                           gpuShare={"memoryMiB": 20480, "smPercent": 50})),
            ("mig", job("mig", SLEEP, mig="1g.10gb")),
            ("gang", job("gang", [PY, "-c", "import time; time.sleep(1)"], replicas=2, gpu=1)),
            ("too-big", job("too-big", SLEEP, replicas=3, gpu=8)),  # never fits: stays pending
            ("oomy-1", share_job("oomy", 11264)),  # OOM -> feedback -> resubmitted as oomy-1-r1
        ]
        for job_id, spec in runs:
            assert (await client.submit(spec, job_id=job_id)).accepted, job_id
        for job_id in ("whole", "shared", "mig"):
            await client.wait(job_id, states={"running"}, timeout_s=60)
        assert (await client.wait("gang", timeout_s=60))["state"] == "succeeded"
        assert (await client.wait("oomy-1-r1", timeout_s=60))["state"] == "succeeded"

        queries = panel_queries()

        async def all_answer() -> bool:
            empty = [(t, e) for t, e in queries if not await asyncio.to_thread(query, base, e)]
            all_answer.empty = empty  # type: ignore[attr-defined]
            return not empty

        try:
            await until(all_answer, "every panel to return a series", timeout_s=45)
        except AssertionError:
            raise AssertionError(f"panels without data: {all_answer.empty}") from None  # type: ignore[attr-defined]

        # and the data says what happened
        def value(expr: str) -> float:
            return max(float(r["value"][1]) for r in query(base, expr))

        assert value('tide_cluster_gpu_allocation_ratio{kind="whole"}') > 0
        assert value('tide_cluster_gpu_allocation_ratio{kind="shared"}') > 0
        assert value('tide_cluster_gpu_allocation_ratio{kind="mig"}') > 0
        assert value('tide_queue_pending_jobs{queue="research/nlp"}') >= 1
        assert value('tide_oom_total') >= 1
        assert value('tide_feedback_memory_multiplier{family="oomy"}') == 1.5
        assert value('tide_gpu_utilization_ratio') > 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for job_id in ("whole", "shared", "mig", "too-big"):
            await client.cancel(job_id)
