"""Consolidation (tide.core.consolidate): move movable running jobs so a job blocked only by fragmentation
fits, and only when every moved job fits again."""

from __future__ import annotations

from tide.core import Cluster, Placer
from tide.core.consolidate import MAX_MOVES, consolidate_for, movable_jobs
from tide.core.cycle_context import CycleContext, CycleState, Plan, QueueUsage, Running
from tide.core.job_placement import place_job
from tide.core.model import MILLI, Allocation, Unfit
from tide.core.preempt import FailedSearches
from tide.core.queues import QueueTree
from tide.core.running_tally import RunningTally
from tide.schemas.events import JobRecord, JobState, PodRecord
from tide.schemas.job import JobSpec

from tests.helpers import small_node

NOW = 1000.0
ON = QueueTree.from_config({"consolidation": {"enabled": True}})  # opt-in


def record(job_id: str, gpu: int, priority: str = "offline-training", state: JobState = JobState.PENDING,
           started_at: float | None = NOW - 300.0, preemptible: bool | None = None,
           last_checkpoint_at: float | None = None) -> JobRecord:
    spec: dict = {"metadata": {"name": job_id, "priorityClass": priority},
                  "spec": {"template": {"command": ["x"], "resources": {"gpu": gpu}}}}
    if preemptible is not None:
        spec["spec"]["preemptible"] = preemptible
    running = state == JobState.RUNNING
    return JobRecord(job_id=job_id, spec=JobSpec.model_validate(spec), state=state, submitted_at=0.0, updated_at=0.0,
                     started_at=started_at if running else None, last_checkpoint_at=last_checkpoint_at,
                     pods=[PodRecord(name=f"{job_id}-0", index=0)])


def whole(node: str, gpus: list[int]) -> Allocation:
    return Allocation(node_id=node, gpu_indices=tuple(gpus), gpu_milli=(MILLI,) * len(gpus),
                      gpu_mem_mib=(81920,) * len(gpus), cpu_milli=1000, memory_mib=1024)


def running_job(job_id: str, node: str, gpus: list[int], **kw: object) -> tuple[str, tuple[JobRecord, list]]:
    return job_id, (record(job_id, len(gpus), state=JobState.RUNNING, **kw), [whole(node, gpus)])


def context(nodes: list, running: Running, pending: list[JobRecord], min_runtime_s: float = 60.0) -> CycleContext:
    """The context ``plan_cycle`` builds for this snapshot (no tides)."""
    cluster = Cluster.from_descriptions(nodes)
    for _, allocs in running.values():
        for a in allocs:
            cluster.allocate(a)
    state = CycleState(nodes=nodes, cluster=cluster, pending=pending, running=running, now=NOW, tree=ON,
                       min_runtime_s=min_runtime_s)
    placer = Placer()
    work = state.cluster.copy()
    work_running: Running = dict(state.running)
    return CycleContext(
        state=state, placer=placer, plan=Plan(), cluster=work, running=work_running,
        usage=QueueUsage.of(state.tree, work_running, state.pending),
        capacity={"gpu": float(work.gpu_exists.sum()), "cpu": float(work.cpu_cap.sum()),
                  "memory": float(work.mem_cap.sum())},
        tide_states={}, tally=RunningTally.of(state.running), failed=FailedSearches(),
    )


def fragmented(jobs_per_node: int = 3, gpus_per_job: int = 2, nodes: int = 4, **kw: object) -> tuple[list, Running]:
    """``nodes`` nodes of 8 GPUs, each running ``jobs_per_node`` jobs of ``gpus_per_job`` GPUs."""
    described = [small_node(f"n{i}", gpus=8) for i in range(nodes)]
    running: Running = {}
    for i in range(nodes):
        for j in range(jobs_per_node):
            job_id, entry = running_job(f"j{i}{j}", f"n{i}", list(range(j * gpus_per_job, (j + 1) * gpus_per_job)),
                                        **kw)
            running[job_id] = entry
    return described, running


def fits_in_order(ctx: CycleContext, moved: list[str], pending: JobRecord) -> bool:
    """Independently of the module: once the moved jobs are gone, the pending job fits, then each moved one."""
    cluster = ctx.state.cluster.copy()
    for job_id in moved:
        for a in ctx.state.running[job_id][1]:
            cluster.release(a)
    for job in [pending] + [ctx.state.running[j][0] for j in moved]:
        placed = place_job(ctx.placer, cluster, job.spec, ctx.state.nodes)
        if isinstance(placed, Unfit):
            return False
        for p in placed:
            cluster.allocate(p.alloc)
    return True


def test_a_whole_node_job_blocked_by_fragmentation_moves_one_node_s_jobs_which_fit_again() -> None:
    nodes, running = fragmented()
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    assert isinstance(place_job(ctx.placer, ctx.cluster, big.spec, nodes), Unfit)  # 8 GPUs free, none whole

    moves = consolidate_for(ctx, big, set(), None)

    assert moves is not None and len(moves) == 3 <= MAX_MOVES
    moved = [m.job_id for m in moves]
    emptied = {running[j][1][0].node_id for j in moved}
    assert len(emptied) == 1  # the three jobs of one node: 6 GPUs moved, the fewest possible
    assert sum(m.gpus for m in moves) == 6
    landed = [node for m in moves for node in m.lands_on]
    assert sorted(landed) == sorted({"n0", "n1", "n2", "n3"} - emptied)  # one on each other node's 2 free GPUs
    assert fits_in_order(ctx, moved, big)
    # recorded as preemptions by the pending job, which is nominated and holds its queue's share
    assert [(p.job_id, p.by) for p in ctx.plan.preemptions] == [(j, "big") for j in moved]
    assert all(p.why.startswith("consolidation") for p in ctx.plan.preemptions)
    assert "big" in ctx.plan.nominations and not ctx.plan.binds
    assert not set(moved) & set(ctx.running)
    assert ctx.usage.get("default")["gpu"] == 24 - 6 + 8


def test_no_move_when_the_moved_jobs_would_not_fit_again() -> None:
    # two 3-GPU jobs per node: freeing a node moves 6 GPUs, but the other nodes have only 2 free each
    nodes, running = fragmented(jobs_per_node=2, gpus_per_job=3)
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    assert consolidate_for(ctx, big, set(), None) is None
    assert ctx.plan == Plan() and ctx.running == running


def test_no_move_when_the_free_gpus_are_too_few_in_all() -> None:
    nodes, running = fragmented(nodes=3)  # 6 GPUs free in all
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    assert consolidate_for(ctx, big, set(), None) is None
    assert ctx.plan == Plan()


def test_higher_priority_non_preemptible_young_and_serving_jobs_are_not_moved() -> None:
    young = {"started_at": NOW - 10}  # minimum runtime 60 s
    for kw in ({"priority": "online-serving"}, {"preemptible": False}, young):
        nodes, running = fragmented(**kw)
        big = record("big", 8)
        ctx = context(nodes, running, [big])
        assert movable_jobs(ctx, big) == []
        assert consolidate_for(ctx, big, set(), None) is None, kw
        assert ctx.plan == Plan()
    # a best-effort job may not move offline-training work (higher priority)
    nodes, running = fragmented()
    low = record("low", 8, priority="best-effort")
    assert consolidate_for(context(nodes, running, [low]), low, set(), None) is None


def test_only_the_movable_node_is_cleared() -> None:
    # n0 runs serving jobs, n1 non-preemptible ones, n2 young ones (but young best-effort work has no
    # minimum runtime), n3 old offline-training jobs: the moves come from n3 only
    nodes, running = fragmented()
    kinds = {"n0": {"priority": "online-serving"}, "n1": {"preemptible": False}, "n2": {"started_at": NOW - 10},
             "n3": {}}
    for job_id, (_, allocs) in list(running.items()):
        node = allocs[0].node_id
        running[job_id] = (record(job_id, 2, state=JobState.RUNNING, **kinds[node]), allocs)
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    assert {m.job_id for m in movable_jobs(ctx, big)} == {"j30", "j31", "j32"}
    moves = consolidate_for(ctx, big, set(), None)
    assert moves is not None and {m.job_id for m in moves} == {"j30", "j31", "j32"}
    assert fits_in_order(ctx, [m.job_id for m in moves], big)

    young_best_effort = {job_id: (record(job_id, 2, priority="best-effort", state=JobState.RUNNING,
                                         started_at=NOW - 1), allocs) for job_id, (_, allocs) in running.items()}
    ctx = context(nodes, young_best_effort, [big])
    assert len(movable_jobs(ctx, big)) == 12


def test_the_number_of_moves_is_bounded() -> None:
    nodes, running = fragmented()
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    assert consolidate_for(ctx, big, set(), None, max_moves=2) is None  # every node needs 3 moves
    assert ctx.plan == Plan()
    moves = consolidate_for(ctx, big, set(), None, max_moves=3)
    assert moves is not None and len(moves) == 3


def test_the_cheapest_set_is_chosen_fewest_gpus_then_least_work_lost() -> None:
    # n0: two 2-GPU jobs (4 free); n1..n3: three 2-GPU jobs (2 free): clearing n0 moves 4 GPUs, not 6
    nodes, running = fragmented()
    del running["j02"]
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    moves = consolidate_for(ctx, big, set(), None)
    assert moves is not None and sorted(m.job_id for m in moves) == ["j00", "j01"]

    # n0 and n1 both need two moves; n1's jobs checkpointed a moment ago, so moving them loses least
    nodes, running = fragmented()
    del running["j02"], running["j12"]
    for job_id in ("j10", "j11"):
        running[job_id] = (record(job_id, 2, state=JobState.RUNNING, last_checkpoint_at=NOW - 5), running[job_id][1])
    ctx = context(nodes, running, [big])
    moves = consolidate_for(ctx, big, set(), None)
    assert moves is not None and sorted(m.job_id for m in moves) == ["j10", "j11"]
    assert sum(m.work_lost_s for m in moves) == 10


def test_excluded_nodes_are_not_cleared_for_the_pending_job() -> None:
    nodes, running = fragmented()
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    moves = consolidate_for(ctx, big, {"n0", "n1", "n2"}, None)
    assert moves is not None and {running[m.job_id][1][0].node_id for m in moves} == {"n3"}


def test_nothing_is_planned_for_a_job_that_fits_or_still_waits_for_its_moves() -> None:
    nodes, running = fragmented()
    small = record("small", 2)
    assert consolidate_for(context(nodes, running, [small]), small, set(), None) is None  # it fits as it is
    waiting = record("big", 8).model_copy(update={"nominated_at": NOW - 1})
    ctx = context(nodes, running, [waiting])
    assert consolidate_for(ctx, waiting, set(), None) is None  # within the preemption timeout
    late = record("big", 8).model_copy(update={"nominated_at": NOW - 1000})
    assert consolidate_for(context(nodes, running, [late]), late, set(), None) is not None


def test_an_elastic_job_is_not_moved() -> None:
    nodes, running = fragmented()
    for job_id, (job, allocs) in list(running.items()):
        body = job.spec.spec.model_copy(update={"replicas": 2, "min_member": 1})
        running[job_id] = (job.model_copy(update={"spec": job.spec.model_copy(update={"spec": body})}), allocs)
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    assert movable_jobs(ctx, big) == [] and consolidate_for(ctx, big, set(), None) is None


def test_plan_cycle_moves_then_binds_the_blocked_job_and_the_moved_ones() -> None:
    """Through ``plan_cycle`` (the live placer's and the replay's entry point): cycle 1 plans the moves
    and nominates the blocked job; once the moved jobs stopped, cycle 2 binds it and them elsewhere."""
    from tide.core.cycle import plan_cycle

    nodes, running = fragmented()
    big = record("big", 8)
    state = CycleState(nodes=nodes, cluster=context(nodes, running, [big]).state.cluster, pending=[big],
                       running=running, now=NOW, tree=ON)
    first = plan_cycle(state, Placer())
    moved = [p.job_id for p in first.preemptions]
    assert len(moved) == 3 and "big" in first.nominations and not first.binds
    # carry it out: the moved jobs stop and requeue; the blocked job is nominated
    cluster = state.cluster.copy()
    for job_id in moved:
        for a in running[job_id][1]:
            cluster.release(a)
    still = {j: e for j, e in running.items() if j not in moved}
    requeued = [record(j, 2) for j in moved]
    nominated = big.model_copy(update={"nominated_at": NOW})
    second = plan_cycle(CycleState(nodes=nodes, cluster=cluster, pending=[nominated, *requeued], running=still,
                                   now=NOW + 1, tree=ON), Placer())
    assert not second.preemptions
    bound = {b.record.job_id: {p.alloc.node_id for p in b.placements} for b in second.binds}
    assert set(bound) == {"big", *moved}
    assert all(bound["big"].isdisjoint(bound[j]) for j in moved)


def test_a_job_far_past_its_last_checkpoint_is_not_moved() -> None:
    """A move restarts a job from its last checkpoint: one 20 minutes past it is not moved, one that
    checkpointed a minute ago is."""
    nodes, running = fragmented(started_at=NOW - 1200.0)
    big = record("big", 8)
    assert consolidate_for(context(nodes, running, [big]), big, set(), None) is None
    nodes, running = fragmented(started_at=NOW - 1200.0, last_checkpoint_at=NOW - 60.0)
    moves = consolidate_for(context(nodes, running, [big]), big, set(), None)
    assert moves is not None and all(m.work_lost_s == 60.0 for m in moves)


def test_consolidation_is_opt_in() -> None:
    """Off unless the queue config enables it: every move restarts a job from its checkpoint."""
    nodes, running = fragmented()
    big = record("big", 8)
    ctx = context(nodes, running, [big])
    ctx.state.tree = QueueTree.from_config(None)
    assert consolidate_for(ctx, big, set(), None) is None
