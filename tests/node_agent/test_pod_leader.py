"""The pod leader: what a pod forks dies with a killed agent; exit statuses pass through unchanged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tide_node_agent.runtime import POD_LEADER, _check_runnable

# a stand-in agent: starts a pod through the leader as the agent does, then waits to be killed
AGENT = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-I", "-S", sys.argv[1], str(os.getpid()), "-", "1", "sh", "-c",
                  f"sleep 300 & echo $! > {sys.argv[2]}; wait"], start_new_session=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(check, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_a_forked_child_of_a_pod_dies_with_the_agent(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(POD_LEADER), str(child_file)])
    try:
        assert wait_for(lambda: child_file.exists() and child_file.read_text().strip())
        child = int(child_file.read_text())
        assert alive(child)
        agent.kill()  # SIGKILL: no handler of the agent runs
        agent.wait()
        assert wait_for(lambda: not alive(child)), "the pod's forked child outlived the agent"
    finally:
        if agent.poll() is None:
            agent.kill()


@pytest.mark.parametrize(("command", "status"), [
    (["sh", "-c", "exit 3"], 3),
    (["sh", "-c", "kill -TERM $$"], -signal.SIGTERM),
    (["sh", "-c", "kill -KILL $$"], -signal.SIGKILL),
    (["true"], 0),
])
def test_the_leader_mirrors_the_commands_exit_status(command: list[str], status: int) -> None:
    rc = subprocess.run([sys.executable, "-I", "-S", str(POD_LEADER), str(os.getpid()), "-", "1", *command],
                        start_new_session=True).returncode
    assert rc == status


def test_a_missing_command_is_refused_before_the_leader_starts(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        _check_runnable("no-such-program-tide", {"PATH": "/usr/bin:/bin"}, tmp_path)
    (tmp_path / "script").write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        _check_runnable("./script", {}, tmp_path)
    _check_runnable("sh", {"PATH": "/usr/bin:/bin"}, tmp_path)


# a stand-in agent that renews its lease file for a while, then freezes (stops renewing)
RENEWING_AGENT = """
import os, subprocess, sys, time
lease, child_file, log = sys.argv[2], sys.argv[3], sys.argv[4]
def renew():
    open(lease + ".tmp", "w").write(f"{time.monotonic() + 0.6:.3f}")
    os.replace(lease + ".tmp", lease)
renew()
subprocess.Popen([sys.executable, "-I", "-S", sys.argv[1], str(os.getpid()), lease, "0.5", "sh", "-c",
                  f"trap '' TERM; sleep 300 & echo $! > {child_file}; wait"],
                 start_new_session=True, stderr=open(log, "w"))
for _ in range(10):
    renew()
    time.sleep(0.1)
os.kill(os.getpid(), 19)  # SIGSTOP: frozen, renewing nothing, its pods still running
"""


def test_the_leader_fences_its_pod_when_a_frozen_agent_stops_renewing_its_lease(tmp_path: Path) -> None:
    lease, child_file, log = tmp_path / "lease", tmp_path / "child.pid", tmp_path / "pod.log"
    agent = subprocess.Popen([sys.executable, "-c", RENEWING_AGENT, str(POD_LEADER), str(lease), str(child_file),
                              str(log)])
    try:
        assert wait_for(lambda: child_file.exists() and child_file.read_text().strip())
        child = int(child_file.read_text())
        renewed_until = time.monotonic() + 1.0
        assert wait_for(lambda: not alive(child), timeout_s=6.0), "the pod outlived the frozen agent's lease"
        # not before the lease ran out (0.6 s after the last renewal), then the grace for SIGTERM (ignored)
        assert time.monotonic() > renewed_until + 0.5 - 0.4
        assert "fenced" in log.read_text()
        assert agent.poll() is None  # the agent itself is only frozen
    finally:
        agent.send_signal(signal.SIGCONT)
        agent.kill()
        agent.wait()
