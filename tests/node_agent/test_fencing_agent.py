"""The agent's side of fencing: it refuses start requests with an old token or past their deadline."""

from __future__ import annotations

import asyncio
import time

import pytest
from tide.schemas.events import ExitReason, GpuAssignment, PodFate, SettlePod, StartPod, StopPod
from tide_node_agent import service as agent_service

from tests.helpers import py
from tests.node_agent.conftest import AgentFactory, CapturedAgent

SLEEP = py("import time; time.sleep(30)")


def start(pod: str, **kw: object) -> StartPod:
    return StartPod(job_id="j", pod=pod, pod_index=0, world_size=1, command=SLEEP, **kw)


async def test_a_start_past_its_deadline_is_refused(make_agent: AgentFactory) -> None:
    agent = make_agent()
    ack = await agent._start(start("j-0.a1", expires_at=time.time() - 3))
    assert not ack.ok and "expired" in ack.error
    assert not agent.pods


async def test_a_start_of_an_attempt_told_to_stop_is_refused(make_agent: AgentFactory) -> None:
    """A stall can deliver the rollback's stop before (or without) the start: the start must not run later."""
    agent = make_agent()
    assert (await agent._stop(StopPod(job_id="j", pod="j-0.a1", grace_s=0))).ok
    ack = await agent._start(start("j-0.a1"))
    assert not ack.ok and "stale" in ack.error and not agent.pods
    assert (await agent._start(start("j-0.a2"))).ok


async def test_a_newer_attempt_stops_an_older_one_and_the_older_cannot_start_again(make_agent: AgentFactory) -> None:
    agent = make_agent()
    assert (await agent._start(start("j-0.a1"))).ok
    assert (await agent._start(start("j-1.a2"))).ok
    exited = await agent.exited("j-0.a1")
    assert exited.reason == ExitReason.STOPPED
    ack = await agent._start(start("j-1.a1"))
    assert not ack.ok and "older than attempt 2" in ack.error
    assert set(agent.pods) == {"j/j-1.a2"}
    await agent.pods["j/j-1.a2"].stop(0)
    await asyncio.sleep(0)


async def test_an_agent_unreached_for_its_lease_stops_its_pods_and_takes_none(make_agent: AgentFactory) -> None:
    agent = make_agent(node_lease_s=0.3, fence_grace_s=0.5, heartbeat_s=0.1)
    assert (await agent._start(start("j-0.a1"))).ok
    agent.nc.is_connected = False  # NATS away: the PINGs go unanswered
    await agent._heartbeat()
    assert "j/j-0.a1" in agent.pods  # still within the lease
    await asyncio.sleep(0.4)
    await agent._heartbeat()
    fenced = await agent.exited("j-0.a1")
    assert fenced.reason == ExitReason.LOST and "fenced" in fenced.message  # lost, not stopped on request
    ack = await agent._start(start("j-0.a2"))
    assert not ack.ok and "lease expired" in ack.error
    agent.nc.is_connected = True  # back: the lease is renewed by the next heartbeat
    await agent._heartbeat()
    assert (await agent._start(start("j-0.a2"))).ok
    await agent.pods["j/j-0.a2"].stop(0)


async def test_settle_tells_running_exited_and_absent_and_an_absent_pod_never_starts(make_agent: AgentFactory) -> None:
    """The placer asks after a start whose reply it lost: the answer must be the truth, and 'absent' final."""
    agent = make_agent()
    assert (await agent._start(start("j-0.a1"))).ok
    assert agent._settle(SettlePod(job_id="j", pod="j-0.a1")).fate == PodFate.RUNNING
    await agent.pods["j/j-0.a1"].stop(0)
    assert (await agent.exited("j-0.a1")).reason == ExitReason.STOPPED
    assert agent._settle(SettlePod(job_id="j", pod="j-0.a1")).fate == PodFate.EXITED
    assert agent._settle(SettlePod(job_id="k", pod="k-0.a3")).fate == PodFate.ABSENT
    late = await agent._start(StartPod(job_id="k", pod="k-0.a3", pod_index=0, world_size=1, command=SLEEP))
    assert not late.ok and "stale" in late.error and "k/k-0.a3" not in agent.pods
    assert (await agent._start(StartPod(job_id="k", pod="k-0.a4", pod_index=0, world_size=1, command=SLEEP))).ok
    await agent.pods["k/k-0.a4"].stop(0)
    await asyncio.sleep(0)


def on_gpu(agent: CapturedAgent, index: int, milli: int = 1000) -> list[GpuAssignment]:
    gpu = agent.node.gpus[index]
    return [GpuAssignment(index=gpu.index, uuid=gpu.uuid, milli=milli)]


async def test_a_start_on_the_gpu_of_a_stopping_pod_runs_only_once_that_pod_is_dead(make_agent: AgentFactory) -> None:
    """A rollback's claims are released when its stop is acknowledged: the next pod on that GPU must not
    run beside the dying one (chaos: a GPU had two holders for milliseconds)."""
    agent = make_agent()
    assert (await agent._start(StartPod(job_id="a", pod="a-0.a1", pod_index=0, world_size=1, command=SLEEP,
                                        gpus=on_gpu(agent, 0)))).ok
    old = agent.pods["a/a-0.a1"]
    assert (await agent._stop(StopPod(job_id="a", pod="a-0.a1", grace_s=0))).ok
    ack = await agent._start(StartPod(job_id="b", pod="b-0.a1", pod_index=0, world_size=1, command=SLEEP,
                                      gpus=on_gpu(agent, 0)))
    assert ack.ok and ack.started
    assert old.proc.returncode is not None and "a/a-0.a1" not in agent.pods
    await agent.pods["b/b-0.a1"].stop(0)


async def test_a_stopping_pod_in_its_grace_period_is_killed_for_a_start_on_its_gpu(
        make_agent: AgentFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_service, "STOPPING_HOLDER_WAIT_S", 0.2)
    agent = make_agent()
    deaf = py("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
              "time.sleep(60)")
    assert (await agent._start(StartPod(job_id="a", pod="a-0.a1", pod_index=0, world_size=1, command=deaf,
                                        gpus=on_gpu(agent, 1)))).ok
    old = agent.pods["a/a-0.a1"]
    while b"up" not in old.log_path.read_bytes():
        await asyncio.sleep(0.02)
    assert (await agent._stop(StopPod(job_id="a", pod="a-0.a1", grace_s=60))).ok
    ack = await agent._start(StartPod(job_id="b", pod="b-0.a1", pod_index=0, world_size=1, command=SLEEP,
                                      gpus=on_gpu(agent, 1)))
    assert ack.ok and ack.started
    assert old.proc.returncode is not None  # killed, not waited out for 60 s
    await agent.pods["b/b-0.a1"].stop(0)


async def test_a_start_on_a_gpu_a_live_pod_holds_is_refused_and_shares_fit_beside_each_other(
        make_agent: AgentFactory) -> None:
    agent = make_agent()
    assert (await agent._start(StartPod(job_id="a", pod="a-0.a1", pod_index=0, world_size=1, command=SLEEP,
                                        gpus=on_gpu(agent, 2)))).ok
    ack = await agent._start(StartPod(job_id="b", pod="b-0.a1", pod_index=0, world_size=1, command=SLEEP,
                                      gpus=on_gpu(agent, 2)))
    assert not ack.ok and "held by running pods" in ack.error and "a/a-0.a1" in ack.error
    assert set(agent.pods) == {"a/a-0.a1"}
    for job in ("s", "t"):
        assert (await agent._start(StartPod(job_id=job, pod=f"{job}-0.a1", pod_index=0, world_size=1, command=SLEEP,
                                            gpus=on_gpu(agent, 3, milli=500)))).ok
    ack = await agent._start(StartPod(job_id="u", pod="u-0.a1", pod_index=0, world_size=1, command=SLEEP,
                                      gpus=on_gpu(agent, 3, milli=100)))
    assert not ack.ok and "held by running pods" in ack.error
    for pod in list(agent.pods.values()):
        await pod.stop(0)
