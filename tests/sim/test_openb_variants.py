"""Generated CPU-heavier openb variants (``tide.sim.openb_variants``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from tide.core import PodRequest
from tide.sim.openb import TracePod, load_pods
from tide.sim.openb_variants import cpu_variant, generated_name, load_trace

TRACES = Path("/work/shared/traces/openb")
needs_trace = pytest.mark.skipif(not TRACES.exists(), reason="openb trace not available")


def default_like() -> list[TracePod]:
    gpu = [TracePod(f"g{i}", PodRequest(cpu_milli=4000, gpu_count=1)) for i in range(90)]
    cpu = [TracePod(f"c{i}", PodRequest(cpu_milli=1000 * (i + 1))) for i in range(10)]
    return cpu[:5] + gpu + cpu[5:]


def test_variant_keeps_gpu_pods_and_draws_cpu_only_pods_to_the_share():
    pods = cpu_variant(default_like(), 250, seed=1)
    kinds = [p.request.kind for p in pods]
    assert kinds.count("none") == 30 and len(pods) == 120  # 30 of 120 = 25%
    assert kinds[:30] == ["none"] * 30  # CPU-only pods first, as the shipped files
    assert [p.request for p in pods[30:]] == [p.request for p in default_like() if p.request.kind != "none"]
    assert {p.request.cpu_milli for p in pods[:30]} <= {1000 * (i + 1) for i in range(10)}
    assert [p.name for p in pods[:2]] == ["openb-pod-0000", "openb-pod-0001"]


def test_variant_is_seeded_and_draws_without_replacement_while_it_can():
    assert cpu_variant(default_like(), 300, seed=4) == cpu_variant(default_like(), 300, seed=4)
    assert cpu_variant(default_like(), 300, seed=4) != cpu_variant(default_like(), 300, seed=5)
    few = cpu_variant(default_like(), 50, seed=2)  # 5 CPU-only pods of the default's 10: each at most once
    assert max(Counter(p.request.cpu_milli for p in few if p.request.kind == "none").values()) == 1


def test_generated_names():
    assert generated_name("cpu300-gen1") == (300, 1)
    assert generated_name("cpu200") is None and generated_name("default") is None
    with pytest.raises(ValueError):
        cpu_variant(default_like(), 1000, seed=0)


@needs_trace
def test_generated_cpu200_matches_the_shipped_file_in_shape():
    shipped = load_pods(TRACES / "openb_pod_list_cpu200.csv")
    generated = load_trace("cpu200-gen1", TRACES)
    assert load_trace("cpu200", TRACES) == shipped
    n_cpu = sum(p.request.kind == "none" for p in shipped)
    assert abs(sum(p.request.kind == "none" for p in generated) - n_cpu) <= 5  # 1,768 shipped, 1,766 drawn
    assert [p.request for p in generated if p.request.kind != "none"] == [
        p.request for p in shipped if p.request.kind != "none"]
