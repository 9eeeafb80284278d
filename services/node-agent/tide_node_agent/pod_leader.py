"""A pod's process-group leader: runs the pod's command as its child and takes the whole group down
when the node agent dies (kill -9 included).

The parent-death signal reaches only the process the agent started, not what a pod forks
(``sh -c "python train.py & wait"``, torchrun's workers); so the agent starts this leader, which asks
for ``SIGUSR2`` on the agent's death and answers it by SIGKILLing its process group. A stop from the
agent (SIGTERM to the group, then SIGKILL) reaches the command directly; the leader only mirrors the
command's exit status, a death by signal included.

It also fences the pod when the agent cannot: the agent writes its node lease's deadline (a
``CLOCK_MONOTONIC`` time, the same clock here) to a lease file on each renewal; a frozen agent (SIGSTOP,
a stalled host) renews nothing, so once the deadline has passed the leader stops its group itself
(SIGTERM, the fence grace, SIGKILL), noting ``FENCED`` in the pod's log so the agent reports the pod lost.

Run as ``python -I -S pod_leader.py <agent pid> <lease file or -> <fence grace s> <argv...>``: standard
library only, so it starts in milliseconds and imports nothing of the agent's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
AGENT_DIED = signal.SIGUSR2
FENCED = "tide: fenced: the node agent's lease ran out"
POLL_S = 0.2  # how often the lease file is read


def _kill_group(signum: int, frame: object) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the leader goes too: nothing of the pod outlives the agent


def lease_expired(lease_file: str) -> bool:
    """Has the deadline the agent last wrote passed? A missing or unreadable file says nothing."""
    try:
        with open(lease_file) as f:
            deadline = float(f.read().strip())
    except (OSError, ValueError):
        return False
    return time.monotonic() > deadline


def fence(child: subprocess.Popen[bytes], grace_s: float) -> None:
    print(FENCED, file=sys.stderr, flush=True)
    os.killpg(os.getpgrp(), signal.SIGTERM)  # the leader ignores it; the command handles it
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    agent, lease_file, grace_s, command = int(argv[0]), argv[1], float(argv[2]), argv[3:]
    signal.signal(AGENT_DIED, _kill_group)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the group's SIGTERM is the command's to handle
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, AGENT_DIED)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != agent:  # the agent died before the death signal was armed
        _kill_group(AGENT_DIED, None)
    try:
        child = subprocess.Popen(command)  # same process group and session; handlers reset on exec
    except OSError as exc:
        print(f"tide: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    while True:
        try:
            rc = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            if lease_file != "-" and lease_expired(lease_file):
                fence(child, grace_s)  # SIGKILLs the leader too, unless the command ended in its grace
    if rc < 0:  # mirror a death by signal, so the agent reads the same status as without a leader
        if -rc != signal.SIGKILL:
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
