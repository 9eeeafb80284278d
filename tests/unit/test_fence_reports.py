"""The placer's fencing judges a heartbeat's pod list as of when its agent took it: a pod whose exit the agent
reported after that is not stopped again (the list was read late), while a pod the placer declared ended itself,
or one listed after its reported exit, still is."""

from __future__ import annotations

from types import SimpleNamespace

from tide import subjects
from tide.schemas.events import ExitReason, JobRecord, PodExited, StopPod
from tide.settings import Settings
from tide_placer.reports import ExitReports, listed_at
from tide_placer.service import PlacerService


def test_a_pod_is_left_out_of_a_list_taken_before_its_reported_exit() -> None:
    reports = ExitReports()
    pods = frozenset({"a/a-0.a1", "b/b-0.a1", "c/c-0.a1"})
    reports.note("n1", "a/a-0.a1", exited_at=100.5, now=0.0)
    reports.note("n1", "b/b-0.a1", exited_at=99.0, now=0.0)
    reports.note("n2", "c/c-0.a1", exited_at=101.0, now=0.0)  # another node's pod of that name
    assert reports.still_listed("n1", pods, listed_at=100.0) == {"b/b-0.a1", "c/c-0.a1"}
    assert reports.still_listed("n1", pods, listed_at=None) == pods, "no time on the list: every pod counts"


def test_the_list_time_header_is_read_as_a_time_or_not_at_all() -> None:
    assert listed_at("1796686536.25") == 1796686536.25
    assert listed_at(None) is None
    assert listed_at("soon") is None
    assert listed_at("nan") is None and listed_at("inf") is None


def test_old_exit_reports_are_let_go() -> None:
    reports = ExitReports(memory_s=60.0)
    for i in range(10_001):
        reports.note("n1", f"j{i}/j{i}-0.a1", exited_at=1.0, now=float(i) / 100)  # the last at 100 s
    assert reports.still_listed("n1", frozenset({"j0/j0-0.a1"}), listed_at=0.5) == {"j0/j0-0.a1"}, "let go"
    assert reports.still_listed("n1", frozenset({"j10000/j10000-0.a1"}), listed_at=0.5) == frozenset()


class _Msg:
    def __init__(self, subject: str, headers: dict[str, str]) -> None:
        self.subject, self.headers = subject, headers


def _placer(stopped: list[StopPod]) -> PlacerService:
    """A placer whose records say no listed pod is current (each ended or unknown), and whose stops are kept."""
    svc = PlacerService(Settings())
    svc.view = SimpleNamespace(record=lambda job_id: None)  # type: ignore[assignment]

    async def no_record(job_id: str) -> JobRecord | None:
        return None

    async def tell(node_id: str, command: StopPod) -> None:
        stopped.append(command)

    svc.jobs = SimpleNamespace(get=no_record)  # type: ignore[assignment]
    svc._records_batch = no_record  # type: ignore[method-assign]
    svc._tell = tell  # type: ignore[method-assign]
    return svc


async def test_a_pod_its_agent_reported_ended_is_not_stopped_on_a_late_heartbeat() -> None:
    stopped: list[StopPod] = []
    svc = _placer(stopped)
    # the heartbeat listing both pods was taken at 100.0 and is read late, after their exits were recorded
    await svc._on_telemetry(_Msg(subjects.heartbeat("n1"), {subjects.PODS_HEADER: "done/done-0.a1,lost/lost-0.a1",
                                                             subjects.PODS_AT_HEADER: "100.0"}))
    await svc._pod_exited(PodExited(node_id="n1", job_id="done", pod="done-0.a1", exit_code=0,
                                    reason=ExitReason.COMPLETED, ts=100.2))
    await svc._pod_exited(PodExited(node_id="n1", job_id="lost", pod="lost-0.a1", exit_code=None,
                                    reason=ExitReason.LOST, ts=100.3))  # the placer's own verdict, not the agent's
    await svc._fence_reported()
    assert [(s.job_id, s.pod) for s in stopped] == [("lost", "lost-0.a1")]


async def test_without_the_list_time_every_listed_stale_pod_is_stopped() -> None:
    """An agent older than the header: as before, each stale pod of its list is stopped."""
    stopped: list[StopPod] = []
    svc = _placer(stopped)
    await svc._on_telemetry(_Msg(subjects.heartbeat("n1"), {subjects.PODS_HEADER: "done/done-0.a1"}))
    await svc._pod_exited(PodExited(node_id="n1", job_id="done", pod="done-0.a1", exit_code=0,
                                    reason=ExitReason.COMPLETED, ts=100.2))
    await svc._fence_reported()
    assert [(s.job_id, s.pod) for s in stopped] == [("done", "done-0.a1")]
