"""Pure computations behind the cluster gauges (tide_metrics.state) and the job-path traces."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tide.schemas.job import JobSpec
from tide.schemas.node import default_h100_node
from tide_metrics import state
from tide_metrics.traces import Timeline, emit

from tests.helpers import small_node


def spec(queue: str = "q", **resources: object) -> JobSpec:
    return JobSpec.model_validate({"metadata": {"name": "j", "queue": queue},
                                   "spec": {"template": {"command": ["x"], "resources": resources}}})


def test_allocation_by_kind_per_node_pool_and_cluster() -> None:
    nodes = {"a": small_node("a", gpus=2, pool="train"), "b": default_h100_node("b", pool="infer")}
    claims = [
        {"node_id": "a", "gpu_indices": [0], "gpu_milli": [1000], "gpu_mem_mib": [81920], "mig": None},
        {"node_id": "a", "gpu_indices": [1], "gpu_milli": [500], "gpu_mem_mib": [10240], "mig": None},
        {"node_id": "b", "gpu_indices": [], "gpu_milli": [], "gpu_mem_mib": [],
         "mig": {"gpu_index": 3, "profile": "3g.40gb", "start": 4}},
        {"node_id": "gone", "gpu_indices": [0], "gpu_milli": [1000]},
    ]
    per_node = state.allocation_by_node(nodes, claims)
    assert per_node["a"].ratio("whole") == 0.5 and per_node["a"].ratio("shared") == 0.25
    assert per_node["a"].ratio("all") == 0.75
    assert abs(per_node["b"].ratio("mig") - 3 / 7 / 8) < 1e-9
    pools = state.rollup(per_node, {"a": "train", "b": "infer"})
    assert pools["train"].gpus == 2 and pools["infer"].gpus == 8
    cluster = state.rollup(per_node, {"a": "", "b": ""})[""]
    assert cluster.gpus == 10 and abs(cluster.ratio("all") - (1.5 + 3 / 7) / 10) < 1e-9


def test_free_gpus_reads_only_the_fields_claims_write_for_the_nodes_gpus() -> None:
    node = small_node("a", gpus=2)
    cap = {"g0.milli": 1000, "g0.mem": 81920, "g1.milli": 1000, "g1.mem": 81920}
    noise = {"cpu": 4000, "mem": 2048, "g0.note": "x", "g01.milli": 1000, "g7.milli": 1000, "x.milli": 5}
    assert all(g.whole_free and g.milli_free == 1000 for g in state.free_gpus(node, cap, noise))
    g0, g1 = state.free_gpus(node, cap, {**noise, "g0.milli": 250, "g0.mem": 1024, "g1.slot3": 1, "g1.slot4": 0})
    assert (g0.milli_free, g0.mem_free_mib, g0.whole_free) == (750, 81920 - 1024, False)
    assert (g1.milli_free, g1.mem_free_mib, g1.whole_free) == (1000, 81920, False)  # a MIG slot taken


def test_fragmentation_is_free_capacity_no_pending_pod_can_use() -> None:
    node = small_node("a", gpus=2)
    cap = {"g0.milli": 1000, "g0.mem": 81920, "g1.milli": 1000, "g1.mem": 81920}
    used = {"g0.milli": 700, "g0.mem": 20000}  # GPU 0 has 0.3 GPU left, GPU 1 is free
    free = {"a": state.free_gpus(node, cap, used)}
    nodes = {"a": node}
    assert state.fragmentation(nodes, free, [])["training"].ratio == 0.0  # nothing waits
    whole2 = state.demand_of(spec(gpu=2))
    f = state.fragmentation(nodes, free, [whole2])["training"]
    assert f.free_gpus == 1.3 and abs(f.fragmented_gpus - 1.3) < 1e-9  # 2 whole GPUs are not there
    whole1 = state.demand_of(spec(gpu=1))
    f = state.fragmentation(nodes, free, [whole1])["training"]
    assert abs(f.fragmented_gpus - 0.3) < 1e-9 and abs(f.ratio - 0.3 / 1.3) < 1e-9
    share = state.demand_of(spec(gpuShare={"memoryMiB": 10240, "smPercent": 20}))
    assert state.fragmentation(nodes, free, [share])["training"].fragmented_gpus == 0
    other_pool = state.demand_of(JobSpec.model_validate({"metadata": {"name": "j"}, "spec": {"template": {
        "command": ["x"], "nodeSelector": {"pool": "infer"}, "resources": {"gpu": 1}}}}))
    assert abs(state.fragmentation(nodes, free, [other_pool])["training"].ratio - 1.0) < 1e-9


def test_pending_counts_and_tidal_lent_borrowed() -> None:
    counts = state.pending_counts([spec("a/x", gpu=1), spec("a/x", gpu=1), spec("b", gpu=1)])
    assert counts == {("a/x", "offline-training"): 2, ("b", "offline-training"): 1}
    guarantees = state.load_guarantees({"queues": [{"name": "a", "guarantee": {"gpu": 8}},
                                                   {"name": "b", "guarantee": {"gpu": 8},
                                                    "children": [{"name": "x"}]}]})
    assert guarantees == {"a": 8.0, "b": 8.0, "b/x": 0.0}
    lb = state.lent_borrowed({"a/x": 2.0, "b/x": 12.0}, guarantees)
    assert lb["b"] == (0.0, 4.0)  # b uses 12 of its 8
    assert lb["a"] == (4.0, 0.0)  # a leaves 6 unused; 4 of them are borrowed
    assert state.lent_borrowed({"c": 3.0}, {}) == {"c": (0.0, 3.0)}


def test_sm_efficiency() -> None:
    assert state.sm_efficiency(1.0, 1.98e9, "H100-80GB") == 1.0
    assert abs(state.sm_efficiency(0.8, 0.99e9, "H100-80GB") - 0.4) < 1e-9
    assert state.sm_efficiency(0.5, 1e9, "unknown") == 0.5  # only the clock seen: it is the top


def test_a_jobs_path_becomes_one_trace_with_its_phases() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    t = Timeline("j1", "q", "offline-training")
    for kind, ts in (("queued", 10.0), ("placed", 12.0), ("pod-started", 12.5), ("running", 13.0)):
        t.add(kind, ts)
    t.add("pod-exited", 20.0, "OOM")
    emit(provider.get_tracer("t"), t, "failed", 20.5, {"family": "f"})
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"job", "job.wait", "job.start", "job.run"}
    root = spans["job"]
    assert root.attributes["tide.job_id"] == "j1" and root.attributes["tide.outcome"] == "failed"
    assert root.attributes["tide.family"] == "f"
    assert (root.start_time, root.end_time) == (10 * 10**9, int(20.5 * 10**9))
    assert (spans["job.wait"].end_time - spans["job.wait"].start_time) == 2 * 10**9
    assert all(s.context.trace_id == root.context.trace_id for s in spans.values())
    assert spans["job.run"].parent.span_id == root.context.span_id
    assert [e.name for e in root.events] == ["pod-started", "pod-exited"]


def test_pool_lending_from_claims() -> None:
    held = [("inference", "training", 2.0), ("inference", None, 1.0), ("training", "training", 4.0),
            ("inference", "inference", 1.0)]
    assert state.pool_lending(held) == {"inference": (2.0, 0.0), "training": (0.0, 2.0)}


def test_event_order_key_is_the_job() -> None:
    from nats.aio.msg import Msg
    from tide import subjects
    from tide_metrics.service import event_order_key

    def key(job_id: str, kind: str) -> str:
        return event_order_key(Msg(_client=None, subject=subjects.job_event(job_id, kind), data=b""))

    assert key("train-1", "placed") == key("train-1", "succeeded")
    assert key("train-1", "placed") != key("train-2", "placed")
