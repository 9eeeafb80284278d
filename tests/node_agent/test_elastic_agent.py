"""The agent's side of elastic gangs: extras started with a newer token beside the gang's pods
(``StartPod.job_floor``) leave those pods running; a start still stops an older attempt of its own pod."""

from __future__ import annotations

import asyncio

from tide.schemas.events import ExitReason, StartPod

from tests.helpers import py
from tests.node_agent.conftest import AgentFactory

SLEEP = py("import time; time.sleep(30)")


def start(pod: str, **kw: object) -> StartPod:
    return StartPod(job_id="j", pod=pod, pod_index=0, world_size=1, command=SLEEP, **kw)


async def test_an_extra_with_a_newer_token_leaves_the_gang_running(make_agent: AgentFactory) -> None:
    agent = make_agent()
    assert (await agent._start(start("j-0.a1", job_floor=1))).ok
    assert (await agent._start(start("j-2.a2", job_floor=1))).ok
    await asyncio.sleep(0.2)
    assert set(agent.pods) == {"j/j-0.a1", "j/j-2.a2"}
    assert (await agent._start(start("j-2.a3", job_floor=1))).ok  # the same pod again: its older attempt goes
    assert (await agent.exited("j-2.a2")).reason == ExitReason.STOPPED
    assert "j/j-0.a1" in agent.pods
    for key in list(agent.pods):
        await agent.pods[key].stop(0)
    await asyncio.sleep(0)
