"""Pod logs served by the agent: listing, bounded chunks by offset, tails, finished pods, safe names."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

from tide.schemas.events import StartPod
from tide_node_agent import logs

from tests.node_agent.conftest import AgentFactory


def ask(work: Path, running: set[str] | None = None, **req: object) -> dict:
    return logs.answer(work, "n0", running or set(), json.dumps(req).encode())


def write_log(work: Path, job: str, pod: str, data: bytes) -> Path:
    path = work / job / f"{pod}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_lists_every_attempt_with_size_and_whether_it_runs(tmp_path: Path) -> None:
    write_log(tmp_path, "job-1", "job-1-0.a1", b"first\n")
    write_log(tmp_path, "job-1", "job-1-0.a2", b"second try\n")
    (tmp_path / "job-1" / "job-1-0.a2.checkpoint").write_text("")  # not a log
    body = ask(tmp_path, {"job-1/job-1-0.a2"}, job_id="job-1")
    assert body["ok"] and body["node_id"] == "n0"
    assert body["pods"] == [
        {"pod": "job-1-0.a1", "name": "job-1-0", "attempt": 1, "size": 6, "running": False},
        {"pod": "job-1-0.a2", "name": "job-1-0", "attempt": 2, "size": 11, "running": True},
    ]
    assert ask(tmp_path, job_id="other")["pods"] == []


def test_reads_in_bounded_chunks_by_offset(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1024  # 256 KiB, not text: bytes come back exact
    write_log(tmp_path, "big", "big-0.a0", data)
    got, offset, replies = b"", 0, 0
    while True:
        body = ask(tmp_path, job_id="big", pod="big-0.a0", offset=offset, limit=10**9)
        assert body["ok"] and body["offset"] == offset and body["size"] == len(data)
        chunk = base64.b64decode(body["data"])
        assert len(chunk) <= logs.MAX_CHUNK_BYTES
        if not chunk:
            break
        got, offset, replies = got + chunk, body["next_offset"], replies + 1
    assert got == data and replies == len(data) // logs.MAX_CHUNK_BYTES
    assert len(json.dumps(ask(tmp_path, job_id="big", pod="big-0.a0"))) < 100 * 1024  # far below max_payload


def test_tail_lines(tmp_path: Path) -> None:
    write_log(tmp_path, "t", "t-0.a0", b"one\ntwo\nthree\nfour\n")
    write_log(tmp_path, "t", "t-1.a0", b"one\ntwo\nno newline")

    def tail(pod: str, n: int) -> bytes:
        return base64.b64decode(ask(tmp_path, job_id="t", pod=pod, tail_lines=n)["data"])

    assert tail("t-0.a0", 2) == b"three\nfour\n"
    assert tail("t-0.a0", 10) == b"one\ntwo\nthree\nfour\n"
    assert tail("t-0.a0", 0) == b""
    assert tail("t-1.a0", 1) == b"no newline"
    assert tail("t-1.a0", 2) == b"two\nno newline"


def test_names_cannot_leave_the_work_dir(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret.log").write_text("nope")
    for req in ({"job_id": ".."}, {"job_id": "a", "pod": "../../secret"}, {"job_id": "a", "pod": ".."},
                {"job_id": "a/b"}, {"job_id": "a", "pod": "x", "offset": -1}, {"job_id": "a", "pod": "x/y"}):
        body = ask(work, **req)
        assert not body["ok"], req
    assert logs.answer(work, "n0", set(), b"not json")["ok"] is False
    missing = ask(work, job_id="a", pod="a-0.a1")
    assert not missing["ok"] and "no log for pod a-0.a1" in missing["error"]


async def test_the_agent_serves_a_finished_pods_log(make_agent: AgentFactory) -> None:
    agent = make_agent()
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    ack = await agent._start(StartPod(job_id="lj", pod="lj-0.a1", pod_index=0, world_size=1,
                                      command=[sys.executable, "-c", code]))
    assert ack.ok, ack.error
    await agent.exited("lj-0.a1")
    listed = logs.answer(agent.work_dir, agent.node_id, set(agent.pods), b'{"job_id": "lj"}')
    assert [(p["pod"], p["running"]) for p in listed["pods"]] == [("lj-0.a1", False)]
    read = logs.answer(agent.work_dir, agent.node_id, set(agent.pods), b'{"job_id": "lj", "pod": "lj-0.a1"}')
    text = base64.b64decode(read["data"]).decode()
    assert "to stdout" in text and "to stderr" in text and read["running"] is False
