"""A pod's process-group leader: runs the pod's command as its child and takes the whole group down
when the node agent dies (kill -9 included).

The parent-death signal reaches only the process the agent started, not what a pod forks
(``sh -c "python train.py & wait"``, torchrun's workers); so the agent starts this leader, which asks
for ``SIGUSR2`` on the agent's death and answers it by SIGKILLing its process group. A stop from the
agent (SIGTERM to the group, then SIGKILL) reaches the command directly; the leader only mirrors the
command's exit status, a death by signal included.

Run as ``python -I -S pod_leader.py <agent pid> <argv...>``: standard library only, so it starts in
milliseconds and imports nothing of the agent's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
AGENT_DIED = signal.SIGUSR2


def _kill_group(signum: int, frame: object) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the leader goes too: nothing of the pod outlives the agent


def main(argv: list[str]) -> int:
    agent, command = int(argv[0]), argv[1:]
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
    rc = child.wait()
    if rc < 0:  # mirror a death by signal, so the agent reads the same status as without a leader
        if -rc != signal.SIGKILL:
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
