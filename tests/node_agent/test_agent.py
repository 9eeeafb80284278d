"""The node agent on the simulated backend: pods, CPU pinning, MPS, OOM, preemption, dynamic MIG, telemetry."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from tide.schemas.events import (
    ExitReason,
    GpuAssignment,
    NodeRegistered,
    PodStarted,
    StartPod,
    StopPod,
    Telemetry,
)
from tide.schemas.node import GpuDescription, MigInstanceDescription, NodeDescription, default_h100_node
from tide_node_agent.gpu.simulated import SimulatedBackend

from tests.helpers import py
from tests.node_agent.conftest import AgentFactory

DUMP_ENV = (
    "import json, os, sys; json.dump({'env': dict(os.environ), 'cpus': sorted(os.sched_getaffinity(0))}, "
    "open(sys.argv[1], 'w'))"
)


def start(pod: str, command: list[str], job: str = "j", **kw: object) -> StartPod:
    return StartPod(job_id=job, pod=pod, pod_index=0, world_size=1, command=command, **kw)


def whole(node: NodeDescription, *indices: int) -> list[GpuAssignment]:
    return [GpuAssignment(index=i, uuid=node.gpus[i].uuid or "") for i in indices]


def mig(node: NodeDescription, i: int, profile: str, start_slot: int, create: bool = True) -> GpuAssignment:
    return GpuAssignment(index=i, uuid=f"MIG-{node.gpus[i].uuid}/{profile}/{start_slot}", milli=0,
                         mig_profile=profile, mig_start=start_slot, mig_create=create)


async def test_pod_gets_its_gpus_gang_env_pinned_cpus_and_a_log(make_agent: AgentFactory, tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    node = NodeDescription(node_id="pin", cpu_milli=2000, memory_mib=4096, numa_nodes=2, gpus=[
        GpuDescription(index=i, model="A100-80GB", memory_mib=81920, uuid=f"GPU-pin-{i}", numa_node=i,
                       cpu_affinity=[cpus[i % len(cpus)]]) for i in range(2)])
    agent = make_agent(node)
    out = tmp_path / "env.json"
    code = "print('hello from the pod'); " + DUMP_ENV
    ack = await agent._start(start("j-0", [sys.executable, "-c", code, str(out)], gpus=whole(node, 1),
                                   env={"MY_VAR": "x"}))
    assert ack.ok, ack.error
    exited = await agent.exited("j-0")
    assert exited.reason == ExitReason.COMPLETED and exited.exit_code == 0
    assert isinstance(agent.sent[0], PodStarted)
    seen = json.loads(out.read_text())
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-pin-1"
    assert seen["env"]["MY_VAR"] == "x" and seen["env"]["TIDE_JOB_ID"] == "j" and seen["env"]["TIDE_WORLD_SIZE"] == "1"
    assert seen["cpus"] == [cpus[1 % len(cpus)]], "pinned to the CPUs of GPU 1's NUMA node"
    assert "hello from the pod" in (agent.work_dir / "j" / "j-0.log").read_text()


async def test_cuda_oom_message_is_oom_with_peak_memory_and_other_failures_are_errors(
    make_agent: AgentFactory,
) -> None:
    node = default_h100_node("n0")
    agent = make_agent(node)
    oom = "import sys; print('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB', file=sys.stderr); " \
          "sys.exit(1)"
    assert (await agent._start(start("oom-0", py(oom), job="oom", gpus=whole(node, 0)))).ok
    assert (await agent._start(start("bad-0", py("import sys; print('ValueError: nope'); sys.exit(3)"), job="bad",
                                     gpus=whole(node, 1)))).ok
    oomed, failed = await agent.exited("oom-0"), await agent.exited("bad-0")
    assert oomed.reason == ExitReason.OOM and oomed.exit_code == 1 and "CUDA out of memory" in oomed.message
    limit = 81559 * 2**20
    assert oomed.memory_limit_bytes == limit and oomed.peak_memory_bytes == limit // 4
    assert failed.reason == ExitReason.ERROR and failed.exit_code == 3 and failed.message == "ValueError: nope"


async def test_memory_at_its_limit_then_failing_is_oom_without_a_message(make_agent: AgentFactory) -> None:
    node = default_h100_node("n0")
    agent = make_agent(node)
    grab = "import os, sys, time; open(os.environ['TIDE_SIM_GPU_MEMORY_FILE'], 'w').write(str({})); sys.exit(1)"
    share = [GpuAssignment(index=2, uuid=node.gpus[2].uuid or "", milli=250, memory_mib=4096)]
    assert (await agent._start(start("full-0", py(grab.format(10**12)), job="full", gpus=share,
                                     share_sm_percent=25, share_memory_mib=4096))).ok
    assert (await agent._start(start("half-0", py(grab.format(2**30)), job="half", gpus=whole(node, 3)))).ok
    full, half = await agent.exited("full-0"), await agent.exited("half-0")
    assert full.reason == ExitReason.OOM and full.peak_memory_bytes == full.memory_limit_bytes == 4096 * 2**20
    assert "GPU memory at its limit" in full.message
    assert half.reason == ExitReason.ERROR and 2**30 <= (half.peak_memory_bytes or 0) < 0.95 * 81559 * 2**20


async def test_share_pods_get_mps_limits_and_the_daemon_is_started_once(make_agent: AgentFactory,
                                                                        tmp_path: Path) -> None:
    node = default_h100_node("n0")
    agent = make_agent(node)
    for k in range(2):
        out = tmp_path / f"env{k}.json"
        share = [GpuAssignment(index=0, uuid=node.gpus[0].uuid or "", milli=300, memory_mib=8192)]
        assert (await agent._start(start(f"s-{k}", py(DUMP_ENV) + [str(out)], job=f"s{k}", gpus=share,
                                         share_sm_percent=30, share_memory_mib=8192))).ok
        await agent.exited(f"s-{k}")
        env = json.loads(out.read_text())["env"]
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(agent.mps.pipe_dir)
    # simulated GPUs: the agent records the daemon it would start (nvidia-cuda-mps-control -d, per-node dirs)
    assert agent.mps.planned == [(["nvidia-cuda-mps-control", "-d"],
                                  {"CUDA_MPS_PIPE_DIRECTORY": str(agent.work_dir / "mps" / "pipe"),
                                   "CUDA_MPS_LOG_DIRECTORY": str(agent.work_dir / "mps" / "log")})]
    assert agent.mps.pipe_dir.is_dir()


async def test_preemption_kills_the_whole_process_group(make_agent: AgentFactory, tmp_path: Path) -> None:
    node = default_h100_node("n0")
    agent = make_agent(node)
    child_pid = tmp_path / "child.pid"
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)']); "
        f"open({str(child_pid)!r}, 'w').write(str(p.pid)); time.sleep(300)"
    )
    assert (await agent._start(start("p-0", py(code), job="p", gpus=whole(node, 0)))).ok
    for _ in range(200):
        if child_pid.exists() and child_pid.read_text():
            break
        await asyncio.sleep(0.02)
    assert (await agent._stop(StopPod(job_id="p", pod="p-0", grace_s=0.3, reason="preempted"))).ok
    exited = await agent.exited("p-0")
    assert exited.reason == ExitReason.STOPPED and exited.signal == 9
    grandchild = int(child_pid.read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the pod's grandchild survived the preemption")
    assert not list(agent.pids_dir.glob("*.pid"))


async def test_dynamic_mig_creates_the_instance_and_undoes_it(make_agent: AgentFactory, tmp_path: Path) -> None:
    node = default_h100_node("n0")
    backend = SimulatedBackend(node)
    agent = make_agent(node, backend=backend)
    before = agent.inventory()
    out = tmp_path / "env.json"
    hold = tmp_path / "go"
    code = DUMP_ENV + f"; import time, os\nwhile not os.path.exists({str(hold)!r}): time.sleep(0.02)"
    ack = await agent._start(start("m-0", py(code) + [str(out)], job="m", gpus=[mig(node, 3, "1g.10gb", 2)]))
    assert ack.ok, ack.error
    assert backend.mig_log == [("mig-mode", 3, "on"), ("create", 3, "1g.10gb@2")]
    created = backend.mig_instances(3)[0]
    for _ in range(200):
        if out.exists() and out.read_text():
            break
        await asyncio.sleep(0.02)
    assert json.loads(out.read_text())["env"]["CUDA_VISIBLE_DEVICES"] == created.uuid
    assert created.uuid and created.uuid.startswith("MIG-") and "/" not in created.uuid
    # the placer's claim covers the instance: the published inventory does not change while it runs
    assert agent.inventory() == before
    # another pod cannot take the same instance, nor switch GPU 3 back
    refused = await agent._start(start("m2-0", ["true"], job="m2", gpus=[mig(node, 3, "1g.10gb", 2, create=False)]))
    assert not refused.ok and "in use" in refused.error
    hold.write_text("")
    assert (await agent.exited("m-0")).reason == ExitReason.COMPLETED
    assert backend.mig_log[-2:] == [("destroy", 3, "1g.10gb@2"), ("mig-mode", 3, "off")]
    assert not backend.mig_mode(3) and agent.inventory() == before


async def test_mig_reuses_configured_instances_and_repartitions_idle_ones(make_agent: AgentFactory) -> None:
    node = default_h100_node("n0")
    node.gpus[0].mig_enabled = True
    node.gpus[0].mig_instances = [MigInstanceDescription(profile="3g.40gb", start=0),
                                  MigInstanceDescription(profile="3g.40gb", start=4)]
    backend = SimulatedBackend(node)
    agent = make_agent(node, backend=backend)
    configured = {m.start: m.uuid for m in backend.mig_instances(0)}
    assert (await agent._start(start("a-0", ["true"], job="a", gpus=[mig(node, 0, "3g.40gb", 4, create=False)]))).ok
    assert agent.state["a/a-0"].gpus.mig_uuid == configured[4] and backend.mig_log == []
    # a 1g.10gb at slot 1 needs the idle 3g.40gb at 0 destroyed first; it comes back when the pod ends
    assert (await agent._start(start("b-0", ["sleep", "0.2"], job="b", gpus=[mig(node, 0, "1g.10gb", 1)]))).ok
    assert backend.mig_log == [("destroy", 0, "3g.40gb@0"), ("create", 0, "1g.10gb@1")]
    await agent.exited("a-0")
    await agent.exited("b-0")
    assert backend.mig_log[2:] == [("destroy", 0, "1g.10gb@1"), ("create", 0, "3g.40gb@0")]
    assert [(m.profile, m.start) for m in backend.mig_instances(0)] == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert backend.mig_mode(0), "MIG mode that was configured stays on"


async def test_mig_refusals_are_clear(make_agent: AgentFactory) -> None:
    node = default_h100_node("n0")
    agent = make_agent(node, mig_auto_enable=False)
    ack = await agent._start(start("x-0", ["true"], job="x", gpus=[mig(node, 0, "1g.10gb", 0)]))
    assert not ack.ok and "MIG mode is off on GPU 0" in ack.error
    resetting = make_agent(node, backend=SimulatedBackend(node, reset_required={1}))
    ack = await resetting._start(start("y-0", ["true"], job="y", gpus=[mig(node, 1, "1g.10gb", 0)]))
    assert not ack.ok and "needs a GPU reset" in ack.error
    busy = make_agent(node)
    assert (await busy._start(start("w-0", ["sleep", "5"], job="w", gpus=whole(node, 2)))).ok
    ack = await busy._start(start("z-0", ["true"], job="z", gpus=[mig(node, 2, "1g.10gb", 0)]))
    assert not ack.ok and "pods use it whole" in ack.error
    ack = await busy._start(start("v-0", ["true"], job="v", gpus=[mig(node, 4, "1g.5gb", 0)]))
    assert not ack.ok and "1g.5gb is not valid on GPU 4 (H100-80GB)" in ack.error
    t4 = NodeDescription(node_id="t4", cpu_milli=8000, memory_mib=8192,
                         gpus=[GpuDescription(index=0, model="T4", memory_mib=15360, uuid="GPU-t4")])
    ack = await make_agent(t4)._start(start("u-0", ["true"], job="u", gpus=[mig(t4, 0, "1g.10gb", 0)]))
    assert not ack.ok and "not MIG-capable" in ack.error


async def test_heartbeats_carry_gpu_samples_every_telemetry_interval(make_agent: AgentFactory) -> None:
    node = default_h100_node("n0")
    agent = make_agent(node, heartbeat_s=0.01, telemetry_s=3600)
    await agent._heartbeat()
    await agent._heartbeat()
    beats = [Telemetry.model_validate_json(d) for _, d in agent.nc.published]
    assert [b.seq for b in beats] == [1, 2] and all(b.heartbeat_s == 0.01 for b in beats)
    assert len(beats[0].gpus) == 8 and beats[1].gpus == [], "samples ride on a heartbeat once per telemetry_s"


async def test_telemetry_is_driven_by_the_running_pods(make_agent: AgentFactory) -> None:
    node = default_h100_node("n0")
    agent = make_agent(node)
    assert (await agent._start(start("one-0", ["sleep", "5"], job="one", gpus=whole(node, 0)))).ok
    assert (await agent._start(start("two-0", ["sleep", "5"], job="two", gpus=whole(node, 4, 5)))).ok
    agent.poll_memory()
    t0 = agent.state["one/one-0"].started
    agent.telemetry(t0 + 0.5)
    agent.backend.inject_xid(6, 48)
    samples, pods = agent.telemetry(t0 + 10.5)
    util = {s.index: s.utilization_ratio for s in samples}
    assert util[0] > 0.8 and util[4] > 0.8 and util[1] == 0 and util[7] == 0
    assert samples[0].processes[0].pid == agent.pods["one/one-0"].proc.pid
    assert samples[0].memory_used_bytes == 81559 * 2**20 // 4 and samples[1].memory_used_bytes == 0
    assert samples[0].nvlink_tx_bytes_per_s == 0 and samples[4].nvlink_tx_bytes_per_s > 0
    by_job = {p.job_id: p for p in pods}
    assert by_job["one"].pcie_bytes > 0 and by_job["one"].nvlink_bytes == 0, "a 1-GPU job sends nothing over NVLink"
    assert by_job["two"].nvlink_bytes > 0 and by_job["two"].gpu_memory_bytes == 2 * (81559 * 2**20 // 4)
    assert by_job["one"].network_bytes is None, "a subprocess shares the host network namespace"
    assert [s.index for s in samples if s.xid_errors] == [6]


def test_simulated_telemetry_is_deterministic_for_a_seed() -> None:
    node = default_h100_node("n0")
    a, b, c = SimulatedBackend(node, seed=7), SimulatedBackend(node, seed=7), SimulatedBackend(node, seed=8)
    busy = {0: 1.0, 3: 0.5}
    assert a.sample(busy) == b.sample(busy) != c.sample(busy)


async def test_inventory_is_republished_on_change(make_agent: AgentFactory) -> None:
    node = default_h100_node("n0")
    backend = SimulatedBackend(node)
    agent = make_agent(node, backend=backend, node_labels="zone=eu-1,pool=inference")
    assert agent.node.labels["zone"] == "eu-1" and agent.node.labels["pool"] == "inference"
    assert agent.node.labels["tide.gpu.model"] == "H100-80GB"
    await agent._check_inventory()
    assert agent.sent == [], "nothing changed"
    backend.set_mig_mode(7, True)  # an operator repartitions GPU 7 by hand
    backend.create_mig(7, "7g.80gb", 0)
    await agent._check_inventory()
    (reg,) = agent.sent
    assert isinstance(reg, NodeRegistered) and reg.node.gpus[7].mig_enabled
    assert [m.profile for m in reg.node.gpus[7].mig_instances] == ["7g.80gb"]


def test_the_protocol_is_implemented_by_both_backends() -> None:
    from tide_node_agent.gpu import GpuBackend
    from tide_node_agent.gpu.nvml import NvmlBackend

    methods = [m for m in vars(GpuBackend) if not m.startswith("_")]
    assert {"discover", "sample", "process_memory", "create_mig", "destroy_mig", "set_mig_mode"} <= set(methods)
    for cls in (SimulatedBackend, NvmlBackend):
        missing = [m for m in methods if not callable(getattr(cls, m, None))]
        assert not missing, f"{cls.__name__} lacks {missing}"


@pytest.mark.parametrize("model", ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"])
def test_simulated_mig_follows_the_profile_table(model: str) -> None:
    from tide.core.mig import profiles_for
    from tide_node_agent.gpu import MigError

    node = NodeDescription(node_id="m", cpu_milli=8000, memory_mib=8192, gpus=[
        GpuDescription(index=0, model=model, memory_mib=40960, uuid="GPU-m-0", mig_capable=True)])
    b = SimulatedBackend(node)
    table = profiles_for(model)
    smallest = min(table.values(), key=lambda p: (p.size, p.memory_mib))
    whole_gpu = max(table.values(), key=lambda p: p.size)
    with pytest.raises(MigError, match="MIG mode is off"):
        b.create_mig(0, smallest.name, 0)
    b.set_mig_mode(0, True)
    uuids = [b.create_mig(0, smallest.name, s) for s in smallest.starts]
    assert len(uuids) == 7 and len(set(uuids)) == 7
    with pytest.raises(MigError, match="overlaps|compute"):
        b.create_mig(0, whole_gpu.name, 0)
    for u in uuids:
        b.destroy_mig(0, u)
    b.create_mig(0, whole_gpu.name, 0)
    with pytest.raises(MigError, match="cannot start at memory slot"):
        b.create_mig(0, smallest.name, 7)
    other = next(n for n in ("1g.5gb", "1g.18gb") if n not in table)
    with pytest.raises(MigError, match="not valid"):
        b.create_mig(0, other, 0)
    with pytest.raises(MigError, match="still has 1 MIG instances"):
        b.set_mig_mode(0, False)


class _Reply:
    def __init__(self, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.data, self.headers, self.reply = data, headers, "_INBOX.x"
        self.answer: bytes | None = None

    async def respond(self, data: bytes) -> None:
        self.answer = data


async def test_a_start_batch_starts_each_pod_in_order_and_answers_each(make_agent: AgentFactory) -> None:
    """One StartPods carries a cycle's starts for this node: each is handled as a StartPod (its own token and
    expiry: a stale one is refused alone), and the answer holds one ack per start, in order."""
    from tide.schemas.events import CommandAck, StartPods

    node = default_h100_node("n0")
    agent = make_agent(node)
    agent._raise_floor("old", 3)  # attempt 2 of job 'old' is over here
    starts = [start(f"a-{i}.a1", py("import time; time.sleep(5)"), job=f"a{i}", gpus=whole(node, i)) for i in range(3)]
    stale = start("old-0.a2", py("print(1)"), job="old", gpus=whole(node, 3))
    msg = _Reply(StartPods(starts=[*starts, stale]).to_bytes())
    await agent._on_command(msg)  # type: ignore[arg-type]
    assert msg.answer is not None
    ack = CommandAck.model_validate_json(msg.answer)
    assert ack.ok and [a.ok for a in ack.acks] == [True, True, True, False]
    assert [a.started for a in ack.acks] == [True, True, True, False]
    assert sorted(agent.pods) == [f"a{i}/a-{i}.a1" for i in range(3)]
    # the answer told the placer they started: their PodStarted stay home while they run
    assert [t.kind for t in agent.sent] == ["pod-started"] * 3
    await agent._flush_transitions()
    assert agent.batches == [], "answered starts of running pods: no status message"
    assert agent._answered == set()


async def test_transitions_that_fail_to_go_out_are_sent_first_next_time(make_agent: AgentFactory) -> None:
    from tide.schemas.events import PodExited, PodStatusBatch

    agent = make_agent()
    sent: list[PodStatusBatch] = []
    fail = [True]

    async def status(message: object) -> None:
        if fail[0]:
            raise ConnectionError("NATS away")
        assert isinstance(message, PodStatusBatch)
        sent.append(message)

    agent._status = status  # type: ignore[method-assign]
    agent._transition(PodStarted(node_id="n0", job_id="j", pod="j-0.a1", pid=1))
    with pytest.raises(ConnectionError):
        await agent._flush_transitions()
    agent._transition(PodExited(node_id="n0", job_id="j", pod="j-0.a1", exit_code=0, reason=ExitReason.COMPLETED))
    fail[0] = False
    await agent._flush_transitions()
    assert [t.kind for t in sent[0].items] == ["pod-started", "pod-exited"]


async def test_an_answered_start_is_reported_only_with_its_pods_exit_in_the_same_heartbeat(
        make_agent: AgentFactory) -> None:
    """Issue 17: a start the agent answered 'started' is not repeated in the status batch while its pod runs
    (one status message per pod fewer); when the pod ended before the heartbeat, its PodStarted goes first, so
    the placer never sees the exit of a pod it does not know started."""
    node = default_h100_node("n0")
    agent = make_agent(node)
    quick = _Reply(start("q-0.a1", py("print(1)"), job="q", gpus=whole(node, 0)).to_bytes())
    await agent._on_command(quick)  # type: ignore[arg-type]
    await agent.exited("q-0.a1")
    await agent._flush_transitions()
    (batch,) = agent.batches
    assert [(t.kind, t.pod) for t in batch.items] == [("pod-started", "q-0.a1"), ("pod-exited", "q-0.a1")]

    slow = _Reply(start("s-0.a1", py("import time; time.sleep(30)"), job="s", gpus=whole(node, 1)).to_bytes())
    await agent._on_command(slow)  # type: ignore[arg-type]
    await agent._flush_transitions()
    assert len(agent.batches) == 1, "the running pod's answered start is not sent again"
    await agent._on_command(_Reply(StopPod(job_id="s", pod="s-0.a1", grace_s=0).to_bytes()))  # type: ignore[arg-type]
    await agent.exited("s-0.a1")
    await agent._flush_transitions()
    assert [(t.kind, t.pod) for t in agent.batches[-1].items] == [("pod-exited", "s-0.a1")]


async def test_a_start_whose_answer_did_not_go_out_is_reported_in_the_status_batch(make_agent: AgentFactory) -> None:
    """The answer could not be sent (NATS away): the PodStarted goes with the next heartbeat as before, so the
    placer learns of the pod even if it never asks."""
    node = default_h100_node("n0")
    agent = make_agent(node)

    class _LostReply(_Reply):
        async def respond(self, data: bytes) -> None:
            raise ConnectionError("NATS away")

    msg = _LostReply(start("l-0.a1", py("import time; time.sleep(30)"), job="l", gpus=whole(node, 0)).to_bytes())
    with pytest.raises(ConnectionError):
        await agent._on_command(msg)  # type: ignore[arg-type]
    assert "l/l-0.a1" in agent.pods
    await agent._flush_transitions()
    (batch,) = agent.batches
    assert [(t.kind, t.pod) for t in batch.items] == [("pod-started", "l-0.a1")]
