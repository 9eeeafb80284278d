"""The placer's decision log (``TIDE_DECISION_LOG``) and its replay: do the replay and the live placer agree?

The placer appends one JSON line per cycle that bound jobs: the snapshot ``plan_cycle`` saw (node
descriptions when they change, pending records, running records with their allocations, lost nodes,
family weights, queue tree and tide rules, ``now`` and the wall time) and the plan's binds (job id ->
pod index and allocation). ``check_log`` re-plans every logged snapshot, in order, with one
``Placer`` (the live one learns the typical pods from the binds in the same order) and lists where
the binds differ.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, time
from pathlib import Path

from tide.core.cluster import Cluster
from tide.core.cycle import CycleState, Plan, plan_cycle
from tide.core.model import Allocation
from tide.core.placer import Placer
from tide.core.queues import QueueSpec, QueueTree
from tide.core.tides import TideRule
from tide.schemas.events import JobRecord
from tide.schemas.feedback import FamilyWeights
from tide.schemas.node import NodeDescription

_last_nodes: dict[str, str] = {}


def binds_of(plan: Plan) -> dict[str, list[list]]:
    """job -> [pod index, allocation] of its binds; the extras of running elastic jobs as ``<job>+extras``."""
    out = {b.record.job_id: [[p.pod_index, p.alloc.to_dict()] for p in b.placements] for b in plan.binds}
    out.update({f"{g.record.job_id}+extras": [[p.pod_index, p.alloc.to_dict()] for p in g.placements]
                for g in plan.grows})
    return out


def append_decision(path: str | Path, state: CycleState, plan: Plan, policy: str) -> None:
    """Append one cycle's snapshot and binds to the decision log (node descriptions only when changed)."""
    line: dict = {
        "now": state.now,
        "wall": state.wall.isoformat() if state.wall else None,
        "policy": policy,
        "pending": [json.loads(r.to_json()) for r in state.pending],
        "running": {j: [json.loads(r.to_json()), [a.to_dict() for a in allocs]] for j, (r, allocs) in
                    state.running.items()},
        "lost": sorted(state.lost),
        "weights": {f: w.model_dump(mode="json") for f, w in state.weights.items()},
        "queues": [{**asdict(q), "guarantee": dict(q.guarantee), "limit": dict(q.limit) if q.limit else None}
                   for q in state.tree.queues.values()],
        "tides": [{"lend": r.lend, "to": r.to, "start": r.start.isoformat(), "end": r.end.isoformat(),
                   "return_before_s": r.return_before_s} for r in state.tides],
        "min_runtime_s": state.min_runtime_s,
        "preemption_timeout_s": state.preemption_timeout_s,
        "extra_allocs": {j: {str(i): a.to_dict() for i, a in pods.items()} for j, pods in state.extra_allocs.items()},
        "binds": binds_of(plan),
    }
    nodes = json.dumps([n.model_dump(mode="json") for n in state.nodes])
    if _last_nodes.get(str(path)) != nodes:
        _last_nodes[str(path)] = nodes
        line["nodes"] = json.loads(nodes)
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def read_log(path: str | Path) -> list[tuple[CycleState, dict[str, list[list]], str]]:
    """Every logged cycle as (the snapshot, the live binds, the policy)."""
    out = []
    nodes: list[NodeDescription] = []
    for raw in Path(path).read_text().splitlines():
        d = json.loads(raw)
        if "nodes" in d:
            nodes = [NodeDescription.model_validate(n) for n in d["nodes"]]
        cluster = Cluster.from_descriptions(nodes)
        running = {}
        for job_id, (record, allocs) in d["running"].items():
            held = [Allocation.from_dict(a) for a in allocs]
            for a in held:
                cluster.allocate(a)
            running[job_id] = (JobRecord.model_validate(record), held)
        tree = QueueTree({q["path"]: QueueSpec(q["path"], q["weight"], q["guarantee"], q["limit"])
                          for q in d["queues"]})
        tides = [TideRule(t["lend"], t["to"], time.fromisoformat(t["start"]), time.fromisoformat(t["end"]),
                          t["return_before_s"]) for t in d["tides"]]
        state = CycleState(
            nodes=nodes, cluster=cluster, pending=[JobRecord.model_validate(r) for r in d["pending"]],
            running=running, tree=tree, tides=tides,
            weights={f: FamilyWeights.model_validate(w) for f, w in d["weights"].items()},
            lost=set(d["lost"]), now=d["now"], wall=datetime.fromisoformat(d["wall"]) if d["wall"] else None,
            min_runtime_s=d["min_runtime_s"], preemption_timeout_s=d["preemption_timeout_s"],
            extra_allocs={j: {int(i): Allocation.from_dict(a) for i, a in pods.items()}
                          for j, pods in d.get("extra_allocs", {}).items()})
        out.append((state, d["binds"], d["policy"]))
    return out


def check_log(path: str | Path) -> tuple[int, list[str]]:
    """Re-plan every logged cycle; returns (cycles checked, differences)."""
    cycles = read_log(path)
    placer: Placer | None = None
    diffs = []
    for k, (state, live, policy) in enumerate(cycles):
        placer = placer or Placer(policy=policy)
        replayed = binds_of(plan_cycle(state, placer))
        if replayed != live:
            diffs.append(f"cycle {k} at {state.now:.3f}: live {live} != replay {replayed}")
    return len(cycles), diffs
