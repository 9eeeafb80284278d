"""Random placements and releases keep the cluster consistent, and releasing everything restores it."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tide.core import Allocation, Cluster, Placer, PodRequest
from tide.schemas.node import default_h100_node

from .conftest import gpu_node

NODES = [
    gpu_node("t4", "T4", 2, cpu=16000, mem=32768),
    gpu_node("a100", "A100-40GB", 2, cpu=32000, mem=65536, gpu_mem=40960, mig=True),
    default_h100_node("h100"),
]

requests = st.one_of(
    st.builds(PodRequest, cpu_milli=st.integers(0, 20000), memory_mib=st.integers(0, 100000),
              gpu_count=st.integers(1, 4)),
    st.builds(PodRequest, cpu_milli=st.integers(0, 8000), gpu_milli=st.integers(1, 999),
              gpu_mem_mib=st.integers(0, 20000)),
    st.builds(PodRequest, cpu_milli=st.integers(0, 8000),
              mig_profile=st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb", "1g.10gb", "3g.40gb", "7g.80gb"])),
    st.builds(PodRequest, cpu_milli=st.integers(0, 30000), memory_mib=st.integers(0, 300000)),
)
ops = st.lists(st.tuples(st.booleans(), requests, st.integers(0, 10**6)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, policy=st.sampled_from(["tide", "bestfit", "worstfit", "random", "gpupacking"]))
def test_random_placements_and_releases_stay_consistent(ops, policy):
    c = Cluster.from_descriptions(NODES)
    start = (c.cpu_free.copy(), c.mem_free.copy(), c.milli_free.copy(), c.gpu_mem_free.copy())
    placer = Placer(policy, seed=1)
    held: list[Allocation] = []
    for release, req, pick in ops:
        if release and held:
            c.release(held.pop(pick % len(held)))
        else:
            placer.observe(req)
            res = placer.place(c, req)
            if isinstance(res, Allocation):
                c.allocate(res)
                held.append(res)
        c.check_consistency()
    for a in reversed(held):
        c.release(a)
    c.check_consistency()
    now = (c.cpu_free, c.mem_free, c.milli_free, c.gpu_mem_free)
    assert all(np.array_equal(a, b) for a, b in zip(start, now, strict=True))
    assert not c.mig_enabled.any() and not c.mig_instances
