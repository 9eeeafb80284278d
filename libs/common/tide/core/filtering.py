"""Filter stage: which nodes and GPUs can take a request now, and why the others cannot."""

from __future__ import annotations

import numpy as np

from tide.core.cluster import Cluster
from tide.core.mig import profiles_for
from tide.core.model import MILLI, PodRequest


def allowed_gpus(cluster: Cluster, req: PodRequest) -> np.ndarray:
    """[N, G] GPUs of an allowed model (any model when the request names none)."""
    if not req.gpu_models:
        return cluster.gpu_exists
    ids = [cluster.model_id(m) for m in req.gpu_models]
    return cluster.gpu_exists & np.isin(cluster.gpu_model, ids)


def mig_gpus(cluster: Cluster, req: PodRequest) -> np.ndarray:
    """[N, G] MIG-capable GPUs whose model has the requested profile."""
    ok = allowed_gpus(cluster, req) & cluster.mig_capable
    if req.mig_profile is None:
        return ok
    good = [i for i, m in enumerate(cluster.models) if req.mig_profile in profiles_for(m)]
    return ok & np.isin(cluster.gpu_model, good)


def selector_mask(cluster: Cluster, req: PodRequest) -> np.ndarray:
    mask = np.ones(cluster.num_nodes, dtype=bool)
    for key, value in req.node_selector:
        mask &= cluster.label_values(key) == value
    return mask


def _models_text(req: PodRequest) -> str:
    return f" of model {'|'.join(req.gpu_models)}" if req.gpu_models else ""


def _selector_text(req: PodRequest) -> str:
    return ",".join(f"{k}={v}" for k, v in req.node_selector)


def never_fits(cluster: Cluster, req: PodRequest) -> str | None:
    """Why ``req`` could not fit even on an empty cluster; None when it could."""
    sel = selector_mask(cluster, req)
    if not sel.any():
        return f"no node matches selector {_selector_text(req)}"
    if req.kind != "none":
        usable = (mig_gpus(cluster, req) if req.kind == "mig" else allowed_gpus(cluster, req)) & sel[:, None]
        if not usable.any():
            what = f"MIG profile {req.mig_profile}" if req.kind == "mig" else "GPUs"
            return f"no node{' matching the selector' if req.node_selector else ''} has {what}{_models_text(req)}"
        sel = sel & usable.any(axis=1)
        if req.gpu_count:
            most = int(usable.sum(axis=1).max())
            if req.gpu_count > most:
                return f"{req.gpu_count} GPUs{_models_text(req)} requested; the largest node has {most}"
        if req.gpu_mem_mib and not (usable & (cluster.gpu_mem_cap >= req.gpu_mem_mib)).any():
            return f"no GPU{_models_text(req)} has {req.gpu_mem_mib} MiB of memory"
    if req.cpu_milli > cluster.cpu_cap[sel].max():
        return f"{req.cpu_milli}m CPU requested; the largest eligible node has {cluster.cpu_cap[sel].max()}m"
    if req.memory_mib > cluster.mem_cap[sel].max():
        return f"{req.memory_mib} MiB memory requested; the largest eligible node has {cluster.mem_cap[sel].max()}"
    return None


def node_filter(cluster: Cluster, req: PodRequest) -> tuple[np.ndarray, list[str]]:
    """Nodes that pass selector, CPU, memory and coarse GPU checks, plus a count of each failure."""
    n = cluster.num_nodes
    reasons: list[str] = []
    mask = np.ones(n, dtype=bool)
    if req.node_selector:
        sel = selector_mask(cluster, req)
        if (~sel).sum():
            reasons.append(f"{int((~sel).sum())} fail selector {_selector_text(req)}")
        mask &= sel
    if req.kind != "none":
        usable = mig_gpus(cluster, req) if req.kind == "mig" else allowed_gpus(cluster, req)
        has = usable.any(axis=1)
        bad = mask & ~has
        if bad.any():
            reasons.append(f"{int(bad.sum())} have no GPU{_models_text(req)}")
        mask &= has
    for label, free, need, unit in (
        ("CPU", cluster.cpu_free, req.cpu_milli, "m"),
        ("memory", cluster.mem_free, req.memory_mib, " MiB"),
    ):
        bad = mask & (free < need)
        if bad.any():
            reasons.append(f"{int(bad.sum())} have less than {need}{unit} {label} free")
        mask &= ~bad
    return mask, reasons


def whole_free(cluster: Cluster, req: PodRequest) -> np.ndarray:
    """[N, G] GPUs free as a whole (all milli and memory) and of an allowed model."""
    free: np.ndarray = (
        allowed_gpus(cluster, req)
        & ~cluster.mig_enabled
        & (cluster.milli_free == MILLI)
        & (cluster.gpu_mem_free == cluster.gpu_mem_cap)
    )
    return free


def share_free(cluster: Cluster, req: PodRequest) -> np.ndarray:
    """[N, G] GPUs with room for the share in both milli-GPU and GPU memory."""
    return (
        allowed_gpus(cluster, req)
        & ~cluster.mig_enabled
        & (cluster.milli_free >= req.gpu_milli)
        & (cluster.gpu_mem_free >= req.gpu_mem_mib)
    )
