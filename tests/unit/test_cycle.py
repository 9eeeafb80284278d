"""The pure scheduling cycle: backfill by declared runtime, preemption plans, tidal returns."""

from __future__ import annotations

import dataclasses
import gc
import random
import weakref
from datetime import datetime

import pytest
from tide.core import Cluster, Placer
from tide.core import cycle as cycle_module
from tide.core.cycle import CycleState, Plan, plan_cycle
from tide.core.job_placement import job_demand, place_job
from tide.core.model import MILLI, Allocation, Unfit
from tide.core.queues import QueueTree
from tide.core.tides import parse_tides
from tide.schemas.events import JobRecord, JobState, PodRecord
from tide.schemas.job import JobSpec

from tests.helpers import small_node


def record(job_id: str, gpu: int, replicas: int = 1, runtime: float | None = None, priority: str = "offline-training",
           pool: str | None = None, state: JobState = JobState.PENDING, t: float = 0.0,
           queue: str = "default") -> JobRecord:
    spec = {"metadata": {"name": job_id, "priorityClass": priority, "queue": queue},
            "spec": {"replicas": replicas, "template": {"command": ["x"], "resources": {"gpu": gpu}}}}
    if runtime is not None:
        spec["spec"]["runtimeSeconds"] = runtime
    if pool:
        spec["spec"]["template"]["nodeSelector"] = {"pool": pool}
    return JobRecord(job_id=job_id, spec=JobSpec.model_validate(spec), state=state, submitted_at=t, updated_at=t,
                     started_at=0.0 if state == JobState.RUNNING else None,
                     pods=[PodRecord(name=f"{job_id}-{i}", index=i) for i in range(replicas)])


def whole(node: str, gpus: list[int]) -> Allocation:
    return Allocation(node_id=node, gpu_indices=tuple(gpus), gpu_milli=(MILLI,) * len(gpus),
                      gpu_mem_mib=(81920,) * len(gpus), cpu_milli=1000, memory_mib=1024)


def state(nodes, running: dict, pending: list[JobRecord], **kw) -> CycleState:
    cluster = Cluster.from_descriptions(nodes)
    for _, allocs in running.values():
        for a in allocs:
            cluster.allocate(a)
    return CycleState(nodes=nodes, cluster=cluster, pending=pending, running=running, now=10.0, **kw)


def test_only_a_job_that_ends_in_time_backfills_in_front_of_a_blocked_gang() -> None:
    nodes = [small_node("n0", gpus=8), small_node("n1", gpus=8)]
    running = {"r": (record("r", 1, runtime=100, state=JobState.RUNNING), [whole("n0", [0])])}
    pending = [record("gang", 8, replicas=2, t=1), record("quick", 1, runtime=50, t=2), record("unknown", 1, t=3)]
    plan = plan_cycle(state(nodes, running, pending, min_runtime_s=1e9), Placer())
    assert [b.record.job_id for b in plan.binds] == ["quick"]  # ends at 60, before r (at 100)
    waiting = {r.job_id: u.reason for r, u in plan.not_placed}
    assert "earmarked 2 node(s)" in waiting["gang"] and "unknown" in waiting
    assert "it fits there once the 1 job(s) on them end (0 of them preemptible)" in waiting["gang"]


def test_priority_preemption_plan_is_the_minimal_whole_gang_and_nominates() -> None:
    nodes = [small_node("n0", gpus=8), small_node("n1", gpus=8)]
    running = {
        "big": (record("big", 4, replicas=2, state=JobState.RUNNING), [whole("n0", [0, 1, 2, 3]),
                                                                      whole("n0", [4, 5, 6, 7])]),
        "small": (record("small", 2, replicas=2, state=JobState.RUNNING), [whole("n1", [0, 1]), whole("n1", [2, 3])]),
        "other": (record("other", 4, state=JobState.RUNNING), [whole("n1", [4, 5, 6, 7])]),
    }
    serve = record("serve", 4, priority="online-serving", t=5)
    plan = plan_cycle(state(nodes, running, [serve], min_runtime_s=0), Placer())
    assert {p.job_id for p in plan.preemptions} in ({"small"}, {"other"})
    assert all(p.by == "serve" for p in plan.preemptions)
    assert "serve" in plan.nominations and not plan.binds


def test_tidal_return_is_planned_outside_the_window() -> None:
    nodes = [small_node("t0", gpus=8, pool="training"), small_node("i0", gpus=8, pool="inference")]
    lent = record("lent", 8, pool="training", state=JobState.RUNNING)
    running = {"lent": (lent, [whole("i0", list(range(8)))])}
    tides = parse_tides({"tides": [{"lend": "inference", "to": "training", "start": "22:00", "end": "07:00"}]})
    night = plan_cycle(state(nodes, running, [], tides=tides, wall=datetime.fromisoformat("2026-12-02T23:00")),
                       Placer())
    assert night.preemptions == []
    dawn = plan_cycle(state(nodes, running, [], tides=tides, wall=datetime.fromisoformat("2026-12-03T06:55")),
                      Placer())
    assert [(p.job_id, p.by) for p in dawn.preemptions] == [("lent", "tide")]


def test_a_failed_victim_search_does_not_stop_a_smaller_job_or_one_with_fewer_nodes_excluded() -> None:
    # every node runs a serving pod, so an 8-GPU serving job finds no victims; the searches after it
    # that ask for less (or exclude fewer nodes) must still be made, and succeed
    nodes = [small_node("n0", gpus=8), small_node("n1", gpus=8)]
    running = {
        "s0": (record("s0", 1, priority="online-serving", state=JobState.RUNNING), [whole("n0", [0])]),
        "s1": (record("s1", 1, priority="online-serving", state=JobState.RUNNING), [whole("n1", [0])]),
        "t0": (record("t0", 7, state=JobState.RUNNING), [whole("n0", list(range(1, 8)))]),
        "t1": (record("t1", 7, state=JobState.RUNNING), [whole("n1", list(range(1, 8)))]),
    }
    big = record("big", 8, priority="online-serving", t=1)
    far = record("far", 4, priority="online-serving", t=2).model_copy(update={"avoid_nodes": ["n0", "n1"]})
    near = record("near", 4, priority="online-serving", t=3).model_copy(update={"avoid_nodes": ["n1"]})
    again = record("again", 4, priority="online-serving", t=4)
    plan = plan_cycle(state(nodes, running, [big, far, near, again], min_runtime_s=0), Placer())
    assert sorted((p.job_id, p.by) for p in plan.preemptions) == [("t0", "near"), ("t1", "again")]
    assert set(plan.nominations) == {"near", "again"}
    assert {r.job_id for r, _ in plan.not_placed} == {"big", "far"}


def test_a_bind_in_between_lets_the_same_search_succeed() -> None:
    # 'early' finds no victims (queue b is at its guarantee, nothing runs below its priority); 'fill' of
    # queue b then binds on the inference node, so b borrows a GPU and 'late', the same search as 'early',
    # may reclaim it: the failed search must not be reused after the bind
    nodes = [small_node("t0", gpus=2, pool="training"), small_node("i0", gpus=1, pool="inference")]
    tree = QueueTree.from_config({"queues": [{"name": "a", "weight": 0.5, "guarantee": {"gpu": 1}},
                                             {"name": "b", "weight": 1, "guarantee": {"gpu": 2}}],
                                  "priorityClasses": {"offline-training": {"preemptionDelay": 0}}})
    running = {f"b{i}": (record(f"b{i}", 1, pool="training", queue="b", state=JobState.RUNNING), [whole("t0", [i])])
               for i in range(2)}
    early = record("early", 1, pool="training", queue="a", t=1)
    fill = record("fill", 1, pool="inference", queue="b", t=2)
    late = record("late", 1, pool="training", queue="a", t=3)
    plan = plan_cycle(state(nodes, running, [early, fill, late], tree=tree, min_runtime_s=0), Placer())
    assert [b.record.job_id for b in plan.binds] == ["fill"]
    assert [(p.job_id, p.by) for p in plan.preemptions] == [("b0", "late")]
    assert [r.job_id for r, _ in plan.not_placed] == ["early"]


def _random_cycle(rng: random.Random) -> CycleState:
    nodes = [small_node(f"n{i}", gpus=rng.choice([4, 8]), pool=rng.choice(["training", "inference"]))
             for i in range(rng.randint(2, 5))]
    tree = QueueTree.from_config({"queues": [{"name": "a", "weight": 2, "guarantee": {"gpu": 6}},
                                             {"name": "b", "weight": 1, "guarantee": {"gpu": 2}}]})
    priorities = ["best-effort", "offline-training", "online-serving"]

    def spec(name: str, t: float) -> JobRecord:
        res: dict = {"cpuMilli": rng.choice([500, 1000, 4000]), "memoryMiB": rng.choice([1024, 8192])}
        if rng.random() < 0.3:
            res["gpuShare"] = {"memoryMiB": rng.choice([10_000, 30_000]), "smPercent": rng.choice([25, 50])}
        else:
            res["gpu"] = rng.choice([1, 1, 2, 4, 8])
        replicas = rng.choice([1, 1, 1, 2, 3])
        body: dict = {"metadata": {"name": name, "priorityClass": rng.choice(priorities), "queue": rng.choice("ab")},
                      "spec": {"replicas": replicas, "template": {"command": ["x"], "resources": res}}}
        if rng.random() < 0.3:
            body["spec"]["template"]["nodeSelector"] = {"pool": rng.choice(["training", "inference"])}
        if replicas > 1 and rng.random() < 0.5:
            body["spec"]["topology"] = {"prefer": "node"}
        return JobRecord(job_id=name, spec=JobSpec.model_validate(body), submitted_at=t, updated_at=t,
                         pods=[PodRecord(name=f"{name}-{i}", index=i) for i in range(replicas)],
                         avoid_nodes=[n.node_id for n in nodes if rng.random() < 0.15])

    cluster = Cluster.from_descriptions(nodes)
    running: dict = {}
    for i in range(rng.randint(3, 14)):
        rec = spec(f"r{i}", -100.0 - i)
        placed = place_job(Placer(), cluster, rec.spec, nodes)
        if isinstance(placed, list):
            for p in placed:
                cluster.allocate(p.alloc)
            rec.state, rec.started_at = JobState.RUNNING, rng.choice([-1000.0, 5.0])
            running[rec.job_id] = (rec, [p.alloc for p in placed])
    pending = [spec(f"p{i}", float(i)) for i in range(rng.randint(4, 16))]
    return CycleState(nodes=nodes, cluster=cluster, pending=pending, running=running, tree=tree, now=10.0,
                      min_runtime_s=60.0)


def test_shortcuts_in_the_victim_search_change_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed-search memo and bisection against the plain greedy search, on random crowded clusters."""

    def decisions(plan: Plan) -> tuple:
        return ([(b.record.job_id, [(p.pod_index, p.alloc) for p in b.placements]) for b in plan.binds],
                plan.preemptions, plan.nominations, [(r.job_id, u) for r, u in plan.not_placed])

    rng = random.Random(8)
    preempting = 0
    for _ in range(60):
        cycle = _random_cycle(rng)
        fast = plan_cycle(cycle, Placer())
        with monkeypatch.context() as m:
            m.setattr(cycle_module, "deterministic", lambda placer: False)
            plain = plan_cycle(cycle, Placer())
        assert decisions(fast) == decisions(plain)
        preempting += bool(plain.preemptions)
    assert preempting >= 10  # the scenarios do exercise the search


def test_a_cycle_leaves_the_snapshot_of_running_jobs_as_it_was() -> None:
    """The placer's view hands every cycle the same allocation lists while a job's claims do not change: the
    planner must change only its own copy (preemptions, consolidation moves, binds)."""
    rng = random.Random(3)
    for _ in range(40):
        cycle = _random_cycle(rng)
        snapshot = {j: (r, list(allocs)) for j, (r, allocs) in cycle.running.items()}
        plan_cycle(cycle, Placer())
        assert cycle.running == snapshot


def test_the_lending_pool_keeps_its_headroom_in_gpus_and_refills_it_from_the_cheapest_lent_node() -> None:
    nodes = [small_node("t0", gpus=8, pool="training"), small_node("i0", gpus=8, pool="inference"),
             small_node("i1", gpus=8, pool="inference"), small_node("i2", gpus=2, pool="inference")]
    busy = record("busy", 8, pool="training", state=JobState.RUNNING)
    running = {"busy": (busy, [whole("t0", list(range(8)))])}
    night = datetime.fromisoformat("2026-12-02T23:00")
    rule = {"lend": "inference", "to": "training", "start": "22:00", "end": "07:00"}
    wanted = [record("train-a", 8, pool="training", t=1.0), record("train-b", 8, pool="training", t=2.0),
              record("train-c", 2, pool="training", t=3.0)]

    def placed(keep: int, running: dict) -> dict[str, str]:
        tides = parse_tides({"tides": [{**rule, "keepGPUs": keep}]})
        plan = plan_cycle(state(nodes, running, wanted, tides=tides, wall=night), Placer())
        return {b.record.job_id: b.placements[0].alloc.node_id for b in plan.binds}

    every = {"train-a": "i0", "train-b": "i1", "train-c": "i2"}
    assert placed(0, running) == every  # every idle inference node is lent
    assert placed(2, running) == {"train-a": "i0", "train-b": "i1"}  # the smallest node covers 2 GPUs
    assert placed(3, running) == {"train-a": "i0"}  # 2 + 8: i1 (last of the two 8-GPU nodes) is kept too
    assert placed(100, running) == {}  # more than the pool has: nothing is lent
    # free GPUs next to the pool's own work count: 2 free beside a 6-GPU serving job lend every idle node
    serving6 = record("serving6", 6, pool="inference", priority="online-serving", state=JobState.RUNNING)
    nodes.append(small_node("i3", gpus=8, pool="inference"))
    assert placed(2, {**running, "serving6": (serving6, [whole("i3", list(range(6)))])}) == every
    nodes.pop()

    # training borrowed i0 (8 GPUs) and all of i1 (4 GPUs); i2 is the headroom. A serving job arriving in
    # the window starts there at once, and the cycle takes back the lent node whose borrowers hold
    # the fewest GPUs (i1), so the next serving job does not wait for a grace period either
    nodes[2] = small_node("i1", gpus=4, pool="inference")
    tides = parse_tides({"tides": [{**rule, "keepGPUs": 2}]})
    borrowed = {**running,
                "lent-8": (record("lent-8", 8, pool="training", state=JobState.RUNNING), [whole("i0", list(range(8)))]),
                "lent-4": (record("lent-4", 4, pool="training", state=JobState.RUNNING), [whole("i1", list(range(4)))])}
    serving = record("serve", 2, pool="inference", priority="online-serving", t=3.0)
    plan = plan_cycle(state(nodes, borrowed, [serving], tides=tides, wall=night), Placer())
    assert [(b.record.job_id, b.placements[0].alloc.node_id) for b in plan.binds] == [("serve", "i2")]
    assert [(p.job_id, p.by) for p in plan.preemptions] == [("lent-4", "tide")]
    assert "headroom" in plan.preemptions[0].why
    # while lent-4 stops, i1 is headroom again: it is not lent to a waiting training job and nothing
    # more is taken back; with the headroom intact nothing is taken back at all
    stopping = {**borrowed, "lent-4": (borrowed["lent-4"][0].model_copy(update={"state": JobState.PREEMPTED}),
                                       borrowed["lent-4"][1]),
                "serve": (serving.model_copy(update={"state": JobState.RUNNING}), [whole("i2", [0, 1])])}
    later = plan_cycle(state(nodes, stopping, [record("train-d", 4, pool="training", t=4.0)], tides=tides,
                             wall=night), Placer())
    assert later.binds == [] and later.preemptions == []
    view = state(nodes, stopping, [], tides=tides, wall=night)
    lent = cycle_module.lending(view.cluster, tides[0], stopping)
    assert [nodes[i].node_id for i in lent.lent] == ["i0"] and lent.headroom == 4
    assert plan_cycle(state(nodes, borrowed, [], tides=tides, wall=night), Placer()).preemptions == []
    with pytest.raises(ValueError, match="keepGPUs"):
        parse_tides({"tides": [{**rule, "keepGPUs": -1}]})


def test_non_preemptible_work_never_borrows_lent_nodes() -> None:
    """Lent nodes go back when the window closes, evicting their borrowers: a job with ``preemptible:
    false`` may not borrow them (KAI: non-preemptible work stays within its quota)."""
    nodes = [small_node("t0", gpus=8, pool="training"), small_node("i0", gpus=8, pool="inference")]
    busy = record("busy", 8, pool="training", state=JobState.RUNNING)
    running = {"busy": (busy, [whole("t0", list(range(8)))])}
    night = datetime.fromisoformat("2026-12-02T23:00")
    tides = parse_tides({"tides": [{"lend": "inference", "to": "training", "start": "22:00", "end": "07:00"}]})
    pinned = record("pinned", 8, pool="training", t=1.0)
    pinned = pinned.model_copy(update={"spec": pinned.spec.model_copy(
        update={"spec": pinned.spec.spec.model_copy(update={"preemptible": False})})})
    borrower = record("borrower", 8, pool="training", t=2.0)
    plan = plan_cycle(state(nodes, running, [pinned, borrower], tides=tides, wall=night), Placer())
    assert [(b.record.job_id, b.placements[0].alloc.node_id) for b in plan.binds] == [("borrower", "i0")]
    assert "pinned" in {r.job_id for r, _ in plan.not_placed}


def test_a_job_preempts_only_after_its_class_preemption_delay() -> None:
    """YuniKorn's preemption.delay: a pending job may preempt once it has waited its class's delay (30 s by
    default; online-serving at once), counted from when it was last queued, so a job that ends meanwhile
    makes room without a preemption."""
    nodes = [small_node("n0", gpus=2)]
    running = {f"be{i}": (record(f"be{i}", 1, priority="best-effort", state=JobState.RUNNING), [whole("n0", [i])])
               for i in range(2)}
    train = record("train", 1, t=0.0)
    assert plan_cycle(state(nodes, running, [train], min_runtime_s=0), Placer()).preemptions == []  # 10 s pending
    serve = record("serve", 1, priority="online-serving", t=9.0)
    plan = plan_cycle(state(nodes, running, [serve], min_runtime_s=0), Placer())
    assert [p.by for p in plan.preemptions] == ["serve"]
    requeued = train.model_copy(update={"queued_at": 5.0})  # requeued at t=5: its delay starts again
    for now, preempts in ((34.0, []), (35.5, ["train"])):
        later = dataclasses.replace(state(nodes, running, [requeued], min_runtime_s=0), now=now)
        assert [p.by for p in plan_cycle(later, Placer()).preemptions] == preempts
    tree = QueueTree.from_config({"priorityClasses": {"offline-training": {"preemptionDelay": 5}}})
    assert [p.by for p in plan_cycle(state(nodes, running, [train], tree=tree, min_runtime_s=0),
                                     Placer()).preemptions] == ["train"]


@pytest.mark.parametrize("policy", [{"preemptionDelay": -1}, {"preemptionDelay": "soon"}])
def test_a_bad_preemption_delay_is_refused(policy: dict) -> None:
    with pytest.raises(ValueError, match="preemptionDelay"):
        QueueTree.from_config({"priorityClasses": {"best-effort": policy}})


def test_a_preemptor_never_frees_room_on_a_node_lent_for_the_tidal_window() -> None:
    """A borrower on a lent inference node would lose the least work, but the room it frees there goes back with
    the node at the window's end (the preemptor would be evicted again): the victim is on the training pool's own
    node. A borrower still runs on a lent node's free room."""
    nodes = [small_node("t0", gpus=8, pool="training"), small_node("i0", gpus=8, pool="inference")]
    old = record("old", 8, pool="training", priority="best-effort", state=JobState.RUNNING)
    young = record("young", 8, pool="training", priority="best-effort", state=JobState.RUNNING)
    young = young.model_copy(update={"started_at": 9.0})  # 1 s of work to lose, against 10 s
    running = {"old": (old, [whole("t0", list(range(8)))]), "young": (young, [whole("i0", list(range(8)))])}
    tides = parse_tides({"tides": [{"lend": "inference", "to": "training", "start": "22:00", "end": "07:00"}]})
    urgent = record("urgent", 8, pool="training", priority="online-serving", t=5)
    plan = plan_cycle(state(nodes, running, [urgent], tides=tides, min_runtime_s=0,
                            wall=datetime.fromisoformat("2026-12-02T23:00")), Placer())
    assert [(p.job_id, p.by) for p in plan.preemptions] == [("old", "urgent")]
    idle = {"young": running["young"]}
    borrower = record("borrower", 8, pool="training", t=6)
    plan = plan_cycle(state(nodes, idle, [borrower], tides=tides, wall=datetime.fromisoformat("2026-12-02T23:00")),
                      Placer())
    assert [b.record.job_id for b in plan.binds] == ["borrower"] and not plan.preemptions


def test_queue_usage_of_counts_every_running_and_nominated_job_in_its_queue_and_ancestors() -> None:
    """``QueueUsage.of`` (summed in place, queue paths looked up once per queue name) equals admitting each
    counted job in turn, exactly; stopping jobs and pending jobs without a nomination do not count."""
    from tide.core.cycle_context import QueueUsage

    tree = QueueTree.from_config({"queues": [{"name": "a", "children": [{"name": "x"}, {"name": "y"}]},
                                             {"name": "b"}]})
    rng = random.Random(7)
    queues = ["a/x", "a/y", "a/x/undeclared", "b", "a"]
    running = {}
    for i in range(60):
        state = rng.choice([JobState.RUNNING, JobState.RUNNING, JobState.PREEMPTED])
        r = record(f"r{i}", rng.randint(1, 4), replicas=rng.randint(1, 3), state=state, queue=rng.choice(queues))
        running[r.job_id] = (r, [])
    pending = [record(f"p{i}", rng.randint(1, 4), queue=rng.choice(queues)) for i in range(20)]
    pending = [p.model_copy(update={"nominated_at": 1.0}) if i % 2 else p for i, p in enumerate(pending)]
    expected = QueueUsage(tree)
    for r, _ in running.values():
        if r.state != JobState.PREEMPTED:
            expected.admit(r.spec.metadata.queue, job_demand(r.spec))
    for p in pending:
        if p.nominated_at is not None:
            expected.admit(p.spec.metadata.queue, job_demand(p.spec))
    got = QueueUsage.of(tree, running, pending)
    assert got.by_path == expected.by_path
    counted = [r for r, _ in running.values() if r.state != JobState.PREEMPTED] + [p for p in pending if p.nominated_at]
    assert got.get("b")["gpu"] == sum(job_demand(r.spec)["gpu"] for r in counted if r.spec.metadata.queue == "b")


def test_job_demand_is_remembered_per_spec_and_handed_out_as_a_copy() -> None:
    one, two = record("one", 2, replicas=3), record("two", 1)
    first = job_demand(one.spec)
    assert first == {"gpu": 6.0, "cpu": first["cpu"], "memory": first["memory"]}
    first["gpu"] = 99.0  # a caller changing its copy changes nothing remembered
    assert job_demand(one.spec)["gpu"] == 6.0
    assert job_demand(two.spec)["gpu"] == 1.0
    # an equal spec parsed again (a new object) gets the same answer; a changed copy its own
    again = JobSpec.model_validate(one.spec.model_dump(by_alias=True))
    assert job_demand(again) == job_demand(one.spec)
    bigger = one.spec.model_copy(update={"spec": one.spec.spec.model_copy(update={"replicas": 4, "min_member": 4})})
    assert job_demand(bigger)["gpu"] == 8.0


def test_the_demand_memo_holds_no_spec_alive() -> None:
    """A finished job's spec goes with its record: the memo forgets it (it held every spec it saw, up to 65,536,
    which the placer's garbage collector scanned on every full collection)."""
    from tide.core import job_placement

    before = len(job_placement._demand_memo)
    specs = [record(f"gone-{i}", 1).spec for i in range(50)]
    refs = [weakref.ref(s) for s in specs]
    assert all(job_demand(s)["gpu"] == 1.0 for s in specs)
    assert len(job_placement._demand_memo) == before + 50
    del specs
    gc.collect()
    assert all(r() is None for r in refs), "the memo keeps specs alive"
    assert len(job_placement._demand_memo) == before


def test_a_job_goes_back_to_a_node_that_failed_it_only_when_nothing_else_fits() -> None:
    # 'j' failed to start on n0 and on n1 (e.g. while their agents restarted): avoiding both for good would
    # leave it pending forever on this two-node cluster
    nodes = [small_node("n0", gpus=8), small_node("n1", gpus=8)]
    failed_on_both = record("j", 4).model_copy(update={"avoid_nodes": ["n0", "n1"]})
    plan = plan_cycle(state(nodes, {}, [failed_on_both]), Placer())
    assert [b.record.job_id for b in plan.binds] == ["j"] and plan.not_placed == []
    # while a node it did not fail on has room, that one is taken
    failed_on_n0 = record("k", 4).model_copy(update={"avoid_nodes": ["n0"]})
    plan = plan_cycle(state(nodes, {}, [failed_on_n0]), Placer())
    assert [p.alloc.node_id for p in plan.binds[0].placements] == ["n1"]
    # a lost node stays out even so
    plan = plan_cycle(state(nodes, {}, [failed_on_both], lost={"n0", "n1"}), Placer())
    assert plan.binds == [] and [r.job_id for r, _ in plan.not_placed] == ["j"]


@pytest.mark.parametrize("replicas", [1, 3])
def test_placing_a_job_leaves_the_cluster_as_it_was(replicas: int) -> None:
    """``place_job`` plans on the cycle's cluster without changing it: a one-pod job on the cluster itself (no
    what-if copy), a gang on a copy (each of its pods placed where the ones before it left room). Placing it
    again, or on a fresh copy, gives the same placement."""
    nodes = [small_node(f"n{i}", gpus=2) for i in range(3)]
    cluster = Cluster.from_descriptions(nodes)
    cluster.allocate(whole("n0", [0]))
    before = {a: getattr(cluster, a).copy() for a in ("milli_free", "gpu_mem_free", "cpu_free", "mem_free",
                                                        "node_stamp")}
    spec = record("j", gpu=1, replicas=replicas).spec
    placed = place_job(Placer(), cluster, spec, nodes)
    assert isinstance(placed, list) and len(placed) == replicas
    for name, array in before.items():
        assert (getattr(cluster, name) == array).all(), name
    again = place_job(Placer(), cluster, spec, nodes)
    fresh = place_job(Placer(), cluster.copy(), spec, nodes)
    assert isinstance(again, list) and isinstance(fresh, list)
    assert [p.alloc for p in again] == [p.alloc for p in fresh] == [p.alloc for p in placed]
    taken = [(p.alloc.node_id, p.alloc.gpu_indices) for p in placed]
    assert len(set(taken)) == replicas and ("n0", (0,)) not in taken  # a gang's pods on distinct free GPUs


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_job_that_can_never_fit_is_told_so_and_a_job_that_waits_for_room_is_not(replicas: int) -> None:
    """``place_job`` asks whether a job could fit on the empty cluster only once no placement was found: the
    answer is the same as asking first. A one-pod job and a gang, each for every reason: a selector no node
    matches, more GPUs per pod than the largest node has (never: not resolvable), and a full cluster (resolvable:
    it waits)."""
    nodes = [small_node(f"n{i}", gpus=2) for i in range(3)]
    empty = Cluster.from_descriptions(nodes)
    nowhere = place_job(Placer(), empty, record("sel", gpu=1, replicas=replicas, pool="nowhere").spec, nodes)
    assert isinstance(nowhere, Unfit) and not nowhere.resolvable and "selector" in nowhere.reason
    too_big = place_job(Placer(), empty, record("big", gpu=3, replicas=replicas).spec, nodes)
    assert isinstance(too_big, Unfit) and not too_big.resolvable and "largest node has 2" in too_big.reason
    full = Cluster.from_descriptions(nodes)
    for node in nodes:
        full.allocate(whole(node.node_id, [0, 1]))
    waits = place_job(Placer(), full, record("waits", gpu=1, replicas=replicas).spec, nodes)
    assert isinstance(waits, Unfit) and waits.resolvable
    assert isinstance(place_job(Placer(), empty, record("fits", gpu=1, replicas=replicas).spec, nodes), list)
