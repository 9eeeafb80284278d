"""``stack.json`` is replaced whole: a reader (the CLI, a test) never finds it empty or half written while the
supervisor rewrites it for a restarted process (CI at a0dc0e6: test_supervision read it mid-write, JSONDecodeError),
and it stays readable by its owner only (it holds the stack's passwords)."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

from tide.stack.launcher import StackInfo


def test_a_reader_never_sees_stack_json_half_written(tmp_path: Path) -> None:
    info = StackInfo(home=str(tmp_path), nats_url="nats://127.0.0.1:1", redis_host="127.0.0.1", redis_port=1,
                     metrics_url="", passwords={f"user{i}": "x" * 64 for i in range(50)}, node_ids=["n0"])
    info.save()
    done = threading.Event()

    def rewrite() -> None:
        for pid in range(300):
            info.pids = {"placer": pid}
            info.save()
        done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    reads = 0
    while not done.is_set():
        assert StackInfo.load(tmp_path).passwords == info.passwords
        reads += 1
    writer.join()
    assert reads > 0 and StackInfo.load(tmp_path).pids == {"placer": 299}
    assert stat.S_IMODE((tmp_path / "stack.json").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["stack.json"]  # no temporary file left
