"""Secrets stay with their owners: pods do not inherit the agents' credentials, and no generated password
shows on a process's command line or in the stack's logs (pods' output included)."""

from __future__ import annotations

import json
from pathlib import Path

from tide.client import TideClient
from tide.stack.auth import Tenant
from tide.stack.launcher import Stack

from tests.helpers import job, py, small_node

CREDENTIAL_VARS = ("TIDE_NATS_PASSWORD", "TIDE_NATS_USER", "TIDE_REDIS_URL", "TIDE_REDIS_SENTINEL_PASSWORD")


async def test_pods_get_no_credentials_and_passwords_show_nowhere(make_stack) -> None:
    stack: Stack = make_stack([small_node("n0", gpus=1)], tenants=[Tenant("alice", queues=["default"])])
    info = stack.info
    assert info is not None
    client = await TideClient.connect(info.settings_for("admin"))
    try:
        code = "import json, os; print('ENV=' + json.dumps(dict(os.environ)))"
        assert (await client.submit(job("env", py(code), gpu=1), job_id="print-env")).accepted
        done = await client.wait("print-env", timeout_s=60)
        assert done["state"] == "succeeded", done
    finally:
        await client.close()
    [log] = (Path(stack.home) / "agents" / "n0" / "print-env").glob("print-env-0.a*.log")
    [line] = [x for x in log.read_text().splitlines() if x.startswith("ENV=")]
    env = json.loads(line.removeprefix("ENV="))
    assert env["TIDE_JOB_ID"] == "print-env"  # the pod's own variables are there
    for var in CREDENTIAL_VARS:
        assert var not in env, var
    secrets = {user: pw for user, pw in info.passwords.items() if pw}
    assert {"queue", "placer", "metrics", "admin", "node-n0", "alice"} <= set(secrets)
    for user, password in secrets.items():
        assert password not in line, f"{user}'s password in the pod's environment"
    # not on any command line of the stack's processes (servers, services, agents, the pod's too)
    for name, pid in info.pids.items():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        for user, password in secrets.items():
            assert password not in cmdline, f"{user}'s password on {name}'s command line"
    # nor in any log: the services', the servers', the agents' and the pods' output
    logs = [*(Path(stack.home) / "logs").glob("*.log"), *(Path(stack.home) / "agents").rglob("*.log")]
    assert len(logs) >= 6
    for path in logs:
        text = path.read_text(errors="replace")
        for user, password in secrets.items():
            assert password not in text, f"{user}'s password in {path}"
