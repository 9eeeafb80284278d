"""The chaos checks themselves: a killed witness counts as alive until its agent reaped it, or one tick and
slack past its last stamp where no agent logged its exit (a frozen or killed agent)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.chaos.harness import TICK, Record, agent_exits, gpus_held_twice, with_agent_exits


def _witness(pod: str, attempt: int, start: float, last: float, how: str) -> Record:
    return Record(job=pod.rsplit("-", 1)[0], pod=pod, attempt=attempt, index=0, node="n1", pid=1, gpus=["GPU-n1-1"],
                  nvidia="GPU-n1-1", sm=None, start=start, last=last, how=how, file=f"{pod}.a{attempt}")


def test_a_pod_started_after_its_gpus_holder_was_reaped_is_no_overlap(tmp_path: Path) -> None:
    # as in CI at d2d40f4: last stamp 0.0, the agent killed and reaped the holder at 0.04, the next pod's witness
    # wrote its start line at 0.19 (inside the 0.2 s slack)
    log = tmp_path / "agent-n1.log"
    log.write_text("\n".join(json.dumps(d) for d in [
        {"node_id": "n1", "job_id": "gang16", "pod": "gang16-9.a1", "exit_code": -9, "event": "pod_exited",
         "timestamp": "2026-12-05T07:46:27.040000Z"},
        {"node_id": "n1", "job_id": "single20", "pod": "single20-0.a1", "event": "pod_started",
         "timestamp": "2026-12-05T07:46:27.100000Z"},
    ]) + "\nnot json\n")
    exits = agent_exits(tmp_path)
    reaped = exits[("gang16", "gang16-9", 1, "n1")]
    assert list(exits) == [("gang16", "gang16-9", 1, "n1")]
    holder = _witness("gang16-9", 1, reaped - 5, reaped - 0.04, "k")
    follower = _witness("single20-0", 1, reaped + 0.15, reaped + 0.8, "e")
    assert holder.end == holder.last + 2 * TICK
    assert gpus_held_twice([holder, follower])  # by the stamps alone: within the slack
    assert not gpus_held_twice(with_agent_exits([holder, follower], exits))  # the agent reaped it before
    early = _witness("single20-0", 1, reaped - 0.02, reaped + 0.8, "e")  # started before the reaping: overlap
    assert gpus_held_twice(with_agent_exits([holder, early], exits))


def test_a_killed_witness_without_an_agent_exit_keeps_the_slack() -> None:
    holder = _witness("gang16-9", 1, 0.0, 5.0, "k")
    follower = _witness("single20-0", 1, 5.1, 6.0, "e")
    assert with_agent_exits([holder], {})[0].end == 5.0 + 2 * TICK
    assert gpus_held_twice(with_agent_exits([holder, follower], {}))
    # an exit logged on another node, or one older than the last stamp, changes nothing
    assert with_agent_exits([holder], {("gang16", "gang16-9", 1, "n2"): 5.01})[0].end == 5.0 + 2 * TICK
    assert with_agent_exits([holder], {("gang16", "gang16-9", 1, "n1"): 4.0})[0].end == 5.0 + 2 * TICK
