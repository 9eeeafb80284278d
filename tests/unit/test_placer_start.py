"""A reserved gang whose background start fails outright is rolled back, not left holding its slots."""

from __future__ import annotations

from types import SimpleNamespace

from tide.schemas.events import CommandAck, JobRecord, JobState, PodFate, PodRecord, PodState, SettlePod
from tide.schemas.job import JobSpec
from tide.settings import Settings
from tide.store.claims import FencedOut
from tide_placer.service import PlacerService, adoptable, committed


async def test_a_start_that_raises_rolls_the_attempt_back() -> None:
    svc = PlacerService(Settings())
    rolled_back: list[tuple[str, int, str]] = []

    async def start(reserved: object, answers: object) -> None:
        raise ConnectionError("redis went away")

    async def rollback(job_id: str, attempt: int, why: str, bad_nodes: list[str] | None = None) -> None:
        rolled_back.append((job_id, attempt, why))

    svc._start, svc._rollback = start, rollback  # type: ignore[method-assign]
    reserved = SimpleNamespace(record=SimpleNamespace(job_id="j1"), resv="j1:3", attempt=3)
    await svc._start_or_roll_back(reserved, {})  # type: ignore[arg-type]
    assert rolled_back == [("j1", 3, "start failed: ConnectionError('redis went away')")]


async def test_a_rollback_that_also_fails_is_left_to_the_lapse_sweep() -> None:
    svc = PlacerService(Settings())

    async def fail(*args: object, **kwargs: object) -> None:
        raise ConnectionError("still away")

    svc._start, svc._rollback = fail, fail  # type: ignore[method-assign]
    reserved = SimpleNamespace(record=SimpleNamespace(job_id="j1"), resv="j1:1", attempt=1)
    await svc._start_or_roll_back(reserved, {})  # type: ignore[arg-type]  # must not raise into the event loop


async def test_a_fenced_start_steps_down_and_leaves_the_attempt_to_the_leader() -> None:
    svc = PlacerService(Settings())
    calls: list[str] = []

    async def fenced(reserved: object, answers: object) -> None:
        raise FencedOut("commit: the placer leader lease is not ours")

    async def rollback(*args: object, **kwargs: object) -> None:
        calls.append("rollback")

    async def step_down(why: str) -> None:
        calls.append(f"step down: {why}")

    svc._start, svc._rollback, svc._step_down = fenced, rollback, step_down  # type: ignore[method-assign]
    svc._own_resv.add("j1:2")
    reserved = SimpleNamespace(record=SimpleNamespace(job_id="j1"), resv="j1:2", attempt=2)
    await svc._start_or_roll_back(reserved, {})  # type: ignore[arg-type]
    assert calls == ["step down: commit: the placer leader lease is not ours"]
    assert svc._own_resv == set()


def _record(state: JobState, pod_states: list[PodState], reservation: str | None = "j:2") -> JobRecord:
    spec = JobSpec.model_validate({"metadata": {"name": "j"},
                                   "spec": {"replicas": len(pod_states), "template": {"command": ["x"]}}})
    pods = [PodRecord(name=f"j-{i}", index=i, node="n1", state=s, attempt=2) for i, s in enumerate(pod_states)]
    return JobRecord(job_id="j", spec=spec, submitted_at=0, updated_at=0, state=state, attempts=2,
                     reservation=reservation, pods=pods)


def test_a_reservation_left_by_another_placer_is_adopted_only_when_all_its_pods_run() -> None:
    assert adoptable(_record(JobState.RUNNING, [PodState.RUNNING, PodState.RUNNING]), "j:2", 2)
    assert adoptable(_record(JobState.RUNNING, [PodState.SUCCEEDED, PodState.RUNNING]), "j:2", 2)  # one ended
    assert not adoptable(_record(JobState.PENDING, [PodState.RUNNING, PodState.STARTING]), "j:2", 2)
    assert not adoptable(_record(JobState.RUNNING, [PodState.RUNNING]), "j:1", 1)  # not the record's reservation
    assert not adoptable(_record(JobState.RUNNING, [PodState.RUNNING], reservation=None), "j:2", 2)
    rec = _record(JobState.RUNNING, [PodState.RUNNING])
    assert committed(rec, "j:2") and rec.reservation is None
    assert not committed(rec, "j:2")


async def test_a_left_reservation_is_adopted_when_its_agents_say_every_pod_started() -> None:
    """The placer that sent the starts died before their acknowledgements and the pod-started reports are not
    handled yet: the agents' answers decide, since letting the reservation lapse would run started pods again."""
    svc = PlacerService(Settings())
    answers: dict[str, PodFate | None] = {"j-0.a2": PodFate.RUNNING, "j-1.a2": PodFate.EXITED}
    asked: list[str] = []

    async def request(node_id: str, command: SettlePod, timeout_s: float | None = None) -> CommandAck | None:
        asked.append(command.pod)
        fate = answers[command.pod]
        return CommandAck(ok=True, fate=fate) if fate else None

    svc._request = request  # type: ignore[method-assign]
    left = _record(JobState.PENDING, [PodState.STARTING, PodState.STARTING])
    assert await svc._agents_started(left, "j:2", 2)
    answers["j-1.a2"] = PodFate.ABSENT
    assert not await svc._agents_started(left, "j:2", 2)  # asked again only after SETTLE_ASK_S
    assert sorted(asked) == ["j-0.a2", "j-1.a2"]
    for fate in (PodFate.ABSENT, None):  # one pod never started, or its agent does not answer: it lapses
        answers["j-1.a2"] = fate
        svc._settle_asked.clear()
        assert not await svc._agents_started(left, "j:2", 2)
    svc._settle_asked.clear()
    answers["j-1.a2"] = PodFate.RUNNING
    assert not await svc._agents_started(_record(JobState.PENDING, [PodState.STARTING] * 2, reservation="j:3"),
                                         "j:2", 2)  # the record moved on: nothing to adopt


def _reserved(job_id: str, attempt: int, nodes: list[str]) -> object:
    """A reserved gang as ``_start_cycle`` sees it (only what it reads)."""
    from tide.core.model import Allocation

    pods = [PodRecord(index=i, name=f"{job_id}-{i}", node=n, state=PodState.STARTING) for i, n in enumerate(nodes)]
    record = _record(JobState.PENDING, [PodState.STARTING] * len(nodes), reservation=f"{job_id}:{attempt}")
    record = record.model_copy(update={"job_id": job_id, "pods": pods, "attempts": attempt})
    placements = [SimpleNamespace(pod_index=i, alloc=Allocation(node_id=n, gpu_indices=(i,), gpu_milli=(1000,),
                                                                 gpu_mem_mib=(0,), cpu_milli=1000, memory_mib=0))
                  for i, n in enumerate(nodes)]
    return SimpleNamespace(record=record, placements=placements, assignments={i: [] for i in range(len(nodes))},
                           resv=f"{job_id}:{attempt}", attempt=attempt, grow=False)


async def test_a_cycle_sends_one_start_request_per_node_and_each_gang_gets_its_own_answers() -> None:
    """Four pods of three gangs on two nodes: one StartPods to the node with three of them, one StartPod to the
    other; every start keeps its token; each gang commits (or not) on its own acks."""
    from tide.schemas.events import StartPod, StartPods

    svc = PlacerService(Settings())
    sent: list[tuple[str, object]] = []

    async def request(node: str, command: object, timeout_s: float | None = None) -> CommandAck | None:
        sent.append((node, command))
        if isinstance(command, StartPods):
            return CommandAck(ok=True, acks=[CommandAck(ok=s.job_id != "b", started=s.job_id != "b", error="no")
                                             for s in command.starts])
        return CommandAck(ok=True, started=True)

    async def placed_event() -> None:
        return None

    answers: dict[str, dict[int, object]] = {}

    async def finish(reserved: SimpleNamespace, got: dict[int, object]) -> None:
        answers[reserved.record.job_id] = got

    svc._request, svc._start_or_roll_back = request, finish  # type: ignore[method-assign, assignment]
    svc._placed_event = lambda reserved: placed_event()  # type: ignore[method-assign, assignment]
    gangs = [_reserved("a", 1, ["n1", "n1"]), _reserved("b", 4, ["n1"]), _reserved("c", 2, ["n2"])]
    await svc._start_cycle(gangs)  # type: ignore[arg-type]
    assert sorted(node for node, _ in sent) == ["n1", "n2"], "one request per node"
    batch = next(c for n, c in sent if n == "n1")
    assert isinstance(batch, StartPods)
    assert [s.pod for s in batch.starts] == ["a-0.a1", "a-1.a1", "b-0.a4"]
    assert isinstance(next(c for n, c in sent if n == "n2"), StartPod)
    assert {j: {i: (a.ok, a.started) for i, a in got.items()} for j, got in answers.items()} == {  # type: ignore[union-attr]
        "a": {0: (True, True), 1: (True, True)}, "b": {0: (False, False)}, "c": {0: (True, True)}}


async def test_a_start_batch_carries_each_start_s_expiry_and_an_unanswered_batch_leaves_every_start_unanswered(
) -> None:
    import nats.errors
    from tide.schemas.events import NODE_COMMAND, StartPod, StartPods

    svc = PlacerService(Settings(start_ack_timeout_s=3.0))
    svc.leading = lambda: True  # type: ignore[method-assign]
    seen: list[bytes] = []

    async def request(subject: str, data: bytes, timeout: float, headers: object = None) -> object:
        seen.append(data)
        raise nats.errors.TimeoutError

    svc.nc = SimpleNamespace(request=request)  # type: ignore[assignment]
    starts = [StartPod(job_id="j", pod=f"j-{i}.a1", pod_index=i, world_size=2, command=["true"]) for i in range(2)]
    assert await svc._request_starts("n1", starts) == [None, None]
    command = NODE_COMMAND.validate_json(seen[0])
    assert isinstance(command, StartPods)
    assert all(s.expires_at is not None for s in command.starts)


async def test_each_start_of_a_batch_carries_its_own_job_s_trace(monkeypatch) -> None:
    """The job records' stored contexts (the queue's intake spans) parent each gang's ``placer.start``; each
    ``StartPod`` carries its gang's, and the request's header the first start's."""
    import tide.tracing as tracing
    import tide_placer.service as placer_service
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from tide.schemas.events import StartPod, StartPods

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(placer_service, "tracer", provider.get_tracer("t"))
    monkeypatch.setattr(tracing, "_spans_wanted", True)
    svc = PlacerService(Settings())
    sent: list[tuple[str, object, str | None]] = []

    async def request(node: str, command: object, timeout_s: float | None = None) -> CommandAck | None:
        sent.append((node, command, (tracing.trace_headers() or {}).get("traceparent")))
        n = len(command.starts) if isinstance(command, StartPods) else 1
        return CommandAck(ok=True, acks=[CommandAck(ok=True, started=True)] * n) if n > 1 else CommandAck(ok=True)

    async def nothing() -> None:
        return None

    async def finish(reserved: SimpleNamespace, got: dict[int, object]) -> None:
        return None

    svc._request, svc._start_or_roll_back = request, finish  # type: ignore[method-assign, assignment]
    svc._placed_event = lambda reserved: nothing()  # type: ignore[method-assign, assignment]
    traces = {"a": "0af7651916cd43dd8448eb211c80319c", "b": "4bf92f3577b34da6a3ce929d0e0e4736"}
    gangs = [_reserved("a", 1, ["n1", "n1"]), _reserved("b", 1, ["n1"]), _reserved("c", 1, ["n2"])]
    for g in gangs:
        job = g.record.job_id  # type: ignore[attr-defined]
        g.record = g.record.model_copy(update={  # type: ignore[attr-defined]
            "trace_parent": f"00-{traces[job]}-b7ad6b7169203331-01" if job in traces else None})
    await svc._start_cycle(gangs)  # type: ignore[arg-type]
    batch, header = next((c, h) for n, c, h in sent if n == "n1")
    assert isinstance(batch, StartPods)
    assert [(s.job_id, s.traceparent.split("-")[1]) for s in batch.starts if s.traceparent] == [
        ("a", traces["a"]), ("a", traces["a"]), ("b", traces["b"])]
    assert header == batch.starts[0].traceparent
    spans = {s.attributes["tide.job_id"]: s for s in exporter.get_finished_spans() if s.name == "placer.start"}
    for job in ("a", "b"):
        assert format(spans[job].context.trace_id, "032x") == traces[job]
        assert spans[job].parent is not None and spans[job].parent.span_id == 0xb7ad6b7169203331
    assert spans["c"].parent is None  # no stored context (a record from before the field): a trace of its own
    lone, lone_header = next((c, h) for n, c, h in sent if n == "n2")
    assert isinstance(lone, StartPod) and lone.traceparent == lone_header
    assert lone.traceparent.split("-")[1] == format(spans["c"].context.trace_id, "032x")
