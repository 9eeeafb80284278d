"""DCGM-exporter-compatible GPU series: the holders of each GPU from the claims, the label sets, and on a
live stack the /metrics endpoint, where a GPU held by a job carries that job's id, pod and queue and joins
the tide_gpu_* series of the same GPU."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from tide.client import TideClient
from tide.schemas.events import GpuSample
from tide_metrics import dcgm, state

from tests.conftest import StackFactory
from tests.helpers import PY, small_node
from tests.metrics.conftest import fast_env
from tests.metrics.test_feedback_e2e import until
from tests.metrics.test_prometheus import SLEEP, job


def test_holders_come_from_the_claims_whole_shared_and_mig() -> None:
    a, b, c = state.Holder("ja", "ja-0", "q1"), state.Holder("jb", "jb-0", "q2"), state.Holder("jc", "jc-1", "q1")
    holders = state.gpu_holders([
        (a, {"node_id": "n", "gpu_indices": [0, 1], "gpu_milli": [1000, 1000]}),
        (b, {"node_id": "n", "gpu_indices": [2], "gpu_milli": [300]}),
        (c, {"node_id": "n", "gpu_indices": [2], "gpu_milli": [300]}),
        (c, {"node_id": "m", "gpu_indices": [], "mig": {"gpu_index": 5, "profile": "1g.10gb", "start": 0}}),
    ])
    assert holders == {("n", 0): (a,), ("n", 1): (a,), ("n", 2): (b, c), ("m", 5): (c,)}


def test_series_carry_dcgm_names_units_and_one_label_set_per_holder() -> None:
    sample = GpuSample(index=3, uuid="GPU-x-3", utilization_ratio=0.5, memory_used_bytes=2 * dcgm.MIB,
                       memory_total_bytes=10 * dcgm.MIB, sm_clock_hz=1.5e9, power_watts=300.0, temperature_c=60.0,
                       ecc_uncorrected_errors=2)
    shared = dcgm.GpuView("x", sample, "H100-80GB", "train",
                          (state.Holder("j1", "j1-0", "q"), state.Holder("j2", "j2-0", "r")), last_xid=79)
    free = dcgm.GpuView("y", GpuSample(index=0, uuid="GPU-y-0"), "A100-80GB", "default")
    fams = {f.name: f for f in dcgm.families([shared, free])}
    assert set(fams) >= {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                         "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS",
                         "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_SM_CLOCK"}

    def values(name: str) -> dict[tuple[str, str], float]:
        return {(s.labels["UUID"], s.labels["hpc_job"]): s.value for s in fams[name].samples}

    assert values("DCGM_FI_DEV_GPU_UTIL") == {("GPU-x-3", "j1"): 50.0, ("GPU-x-3", "j2"): 50.0, ("GPU-y-0", ""): 0.0}
    assert values("DCGM_FI_DEV_FB_USED")[("GPU-x-3", "j1")] == 2.0
    assert values("DCGM_FI_DEV_FB_FREE")[("GPU-x-3", "j1")] == 8.0
    assert values("DCGM_FI_DEV_SM_CLOCK")[("GPU-x-3", "j1")] == 1500.0
    assert values("DCGM_FI_DEV_POWER_USAGE")[("GPU-x-3", "j2")] == 300.0
    assert values("DCGM_FI_DEV_GPU_TEMP")[("GPU-x-3", "j2")] == 60.0
    assert values("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")[("GPU-x-3", "j2")] == 2.0
    assert values("DCGM_FI_DEV_XID_ERRORS") == {("GPU-x-3", "j1"): 79.0, ("GPU-x-3", "j2"): 79.0, ("GPU-y-0", ""): 0.0}
    j2 = next(s.labels for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples if s.labels["hpc_job"] == "j2")
    assert j2 == {"gpu": "3", "UUID": "GPU-x-3", "device": "nvidia3", "modelName": "H100-80GB", "Hostname": "x",
                  "pool": "train", "pod": "j2-0", "namespace": "r", "queue": "r", "hpc_job": "j2"}


def _by_name(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


async def test_live_metrics_label_each_gpu_with_the_job_pod_and_queue_holding_it(make_stack: StackFactory) -> None:
    stack = make_stack(nodes=[small_node("n0", gpus=3, model="H100-80GB")], env=fast_env(["n0"]))
    assert stack.info is not None
    metrics_url = stack.info.metrics_url
    client = await TideClient.connect(stack.info.settings_for("admin"))
    runs = {
        "held": job("held", SLEEP, queue="research/nlp", gpu=1),
        "share-a": job("share-a", SLEEP, queue="serving", priority="online-serving",
                       gpuShare={"memoryMiB": 10240, "smPercent": 30}),
        "share-b": job("share-b", [PY, "-c", "import time; time.sleep(300)"], queue="serving",
                       priority="online-serving", gpuShare={"memoryMiB": 10240, "smPercent": 30}),
    }
    try:
        for job_id, spec in runs.items():
            assert (await client.submit(spec, job_id=job_id)).accepted, job_id
        records = {j: await client.wait(j, states={"running"}, timeout_s=60) for j in runs}
        expected: dict[str, set[tuple[str, str, str]]] = {}  # GPU UUID -> {(job, pod, queue)}
        for job_id, rec in records.items():
            for pod in rec["pods"]:
                assert pod["node"] == "n0"
                for uuid in pod["gpus"]:
                    expected.setdefault(uuid, set()).add((job_id, pod["name"], runs[job_id]["metadata"]["queue"]))

        async def labelled() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            metrics = _by_name(await asyncio.to_thread(_fetch, metrics_url))
            held: dict[str, set[tuple[str, str, str]]] = {}
            for labels, _ in metrics.get("DCGM_FI_DEV_GPU_UTIL", []):
                if labels.get("hpc_job"):
                    held.setdefault(labels["UUID"], set()).add((labels["hpc_job"], labels["pod"], labels["namespace"]))
            return metrics if held == expected else None

        metrics = await until(labelled, "DCGM series labelled with the jobs holding the GPUs", timeout_s=30)
        util = metrics["DCGM_FI_DEV_GPU_UTIL"]
        assert {labels["UUID"] for labels, _ in util} == {f"GPU-n0-{i}" for i in range(3)}
        free = [labels for labels, _ in util if labels["UUID"] not in expected]
        assert len(free) == 1 and not free[0].get("hpc_job") and not free[0].get("pod")
        tide_util = {(labels["node"], labels["gpu"]): v for labels, v in metrics["tide_gpu_utilization_ratio"]}
        for labels, _value in util:
            assert labels["Hostname"] == "n0" and labels["modelName"] == "H100-80GB"
            assert labels["device"] == f"nvidia{labels['gpu']}" and labels["UUID"] == f"GPU-n0-{labels['gpu']}"
            assert labels.get("queue", "") == labels.get("namespace", "")
            assert (labels["Hostname"], labels["gpu"]) in tide_util  # joins the tide_* series on (node, gpu)
        held_uuid = next(u for u, h in expected.items() if any(j == "held" for j, _, _ in h))
        held_gpu = next(labels["gpu"] for labels, _ in util if labels["UUID"] == held_uuid)
        for name in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED",
                     "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_XID_ERRORS"):
            assert any(labels["hpc_job"] == "held" for labels, _ in metrics[name]), name
        for name in ("tide_gpu_power_watts", "tide_gpu_temperature_celsius", "tide_gpu_ecc_uncorrected_errors"):
            assert any(labels["gpu"] == held_gpu for labels, _ in metrics[name]), name
        # the same sample under both names (read at the same scrape, but a new sample may land in between)
        assert next(v for labels, v in metrics["DCGM_FI_DEV_POWER_USAGE"] if labels["hpc_job"] == "held") > 0
        assert next(v for labels, v in metrics["tide_gpu_power_watts"] if labels["gpu"] == held_gpu) > 0
    finally:
        for job_id in runs:
            await client.cancel(job_id)
        await client.close()


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()
