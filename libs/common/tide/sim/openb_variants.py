"""openb traces by name, CPU-heavier variants included: generated from the default trace as the shipped
``cpuNNN`` files were.

The shipped ``openb_pod_list_cpuNNN.csv`` files keep every GPU pod of the default trace, in order, and
carry CPU-only pods drawn from the default trace's CPU-only pods until they are NNN/10 % of the pods
(cpu050: 375 of 7,439; cpu100: 789 of 7,853; cpu200: 1,768 of 8,832), listed first: drawn without
replacement where the default has enough of them (cpu050, cpu100: each default pod at most once) and
with replacement beyond (cpu200: 1,768 drawn, 871 distinct). ``cpu_variant`` does the same, seeded;
the name ``cpuNNN-genS`` stands for the variant with NNN per mille of CPU-only pods drawn with seed S.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tide.sim.openb import TracePod, load_pods

GENERATED = re.compile(r"^cpu(\d{3})-gen(\d+)$")


def cpu_variant(default: list[TracePod], permille: int, seed: int) -> list[TracePod]:
    """The default trace's GPU pods plus CPU-only pods drawn from its own (``seed``) until they are
    ``permille`` per mille of all pods; CPU-only pods first, renamed ``openb-pod-NNNN`` in order."""
    if not 0 <= permille < 1000:
        raise ValueError(f"CPU-only share must be in [0, 1000) per mille, got {permille}")
    gpu = [p for p in default if p.request.kind != "none"]
    cpu = [p for p in default if p.request.kind == "none"]
    want = round(permille * len(gpu) / (1000 - permille))
    if want and not cpu:
        raise ValueError("the trace has no CPU-only pods to draw from")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(cpu), size=want, replace=want > len(cpu)) if want else np.zeros(0, dtype=int)
    pods = [cpu[int(i)] for i in picks] + gpu
    return [TracePod(f"openb-pod-{k:04d}", p.request) for k, p in enumerate(pods)]


def generated_name(name: str) -> tuple[int, int] | None:
    """``(permille, seed)`` of a generated variant's name (``cpu300-gen1``), None for other names."""
    m = GENERATED.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def load_trace(name: str, trace_dir: str | Path) -> list[TracePod]:
    """The pods of an openb trace by name: a shipped file (``openb_pod_list_<name>.csv``) or a generated
    variant (``cpuNNN-genS``, drawn from the shipped default trace)."""
    generated = generated_name(name)
    if generated is None:
        return load_pods(Path(trace_dir) / f"openb_pod_list_{name}.csv")
    permille, seed = generated
    return cpu_variant(load_pods(Path(trace_dir) / "openb_pod_list_default.csv"), permille, seed)
