"""The NVML backend against the NVML library itself (no driver here) and against a pynvml-shaped 8 x H100 node."""

from __future__ import annotations

import pytest
from tide.core.mig import profiles_for
from tide.settings import Settings
from tide_node_agent.gpu import BackendUnavailable, MigError, with_labels
from tide_node_agent.gpu.nvml import NvmlBackend, tide_model_name
from tide_node_agent.service import NodeAgent, make_backend

from tests.node_agent.fake_nvml import FakeNvml


def test_real_nvml_without_a_driver_refuses_clearly() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(BackendUnavailable, match="NVML is not available on this machine.*TIDE_NVML_BACKEND=simulated"):
        NvmlBackend("n0")
    # the agent refuses to start in NVML mode instead of falling back to simulation
    with pytest.raises(SystemExit, match="cannot start in NVML mode.*NVML Shared Library Not Found"):
        make_backend(Settings(node_id="n0", nvml_backend="nvml"))
    with pytest.raises(SystemExit, match="cannot start in NVML mode"):
        NodeAgent(Settings(node_id="n0", nvml_backend="nvml"))


@pytest.mark.parametrize(("name", "gib", "model"), [
    ("NVIDIA H100 80GB HBM3", 79.6, "H100-80GB"),
    ("NVIDIA H200", 140.4, "H200-141GB"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", 79.2, "A100-80GB"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"),
    ("Tesla T4", 14.6, "T4-16GB"),
])
def test_nvml_names_map_to_the_models_the_mig_tables_use(name: str, gib: float, model: str) -> None:
    assert tide_model_name(name, int(gib * 2**30)) == model


def backend(**kw) -> tuple[NvmlBackend, FakeNvml]:
    fake = FakeNvml(**kw)
    return NvmlBackend("h100-node", labels={"pool": "training"}, nvml=fake), fake


def test_discovery_of_an_8_x_h100_node() -> None:
    b, fake = backend(cpus=8)
    assert fake.initialized
    node = with_labels(b.discover(), {"zone": "a"})
    assert [g.index for g in node.gpus] == list(range(8))
    g0, g5 = node.gpus[0], node.gpus[5]
    assert g0.model == "H100-80GB" and g0.memory_mib == 81559
    assert g0.uuid == "GPU-00000000-1111-2222-3333-444444444444"
    assert g0.compute_capability == "9.0"
    assert g0.pci_bus_id == "00000000:18:00.0" and g5.pci_bus_id == "00000000:AB:00.0"
    assert g0.mig_capable and not g0.mig_enabled and g0.mig_instances == []
    assert (g0.numa_node, g5.numa_node) == (0, 1) and node.numa_nodes == 2
    assert g0.cpu_affinity == [0, 1, 2, 3] and g5.cpu_affinity == [4, 5, 6, 7]
    # PCIe switches from the common-ancestor levels, NVLink through the NVSwitch to every other GPU
    assert [g.pcie_switch for g in node.gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(g.nvlink_domain == 0 for g in node.gpus)
    assert g0.nvlink_peers == [1, 2, 3, 4, 5, 6, 7]
    assert set(g0.topology.values()) == {"nvlink"}
    assert node.labels["tide.gpu.model"] == "H100-80GB" and node.labels["tide.gpu.count"] == "8"
    assert node.labels["tide.gpu.mig-capable"] == "true" and node.labels["tide.gpu.nvlink"] == "true"
    assert node.labels["tide.gpu.memory-gib"] == "79"
    assert node.labels["pool"] == "training" and node.labels["zone"] == "a"


def test_topology_classes_without_nvlink() -> None:
    b, fake = backend()
    fake.nvmlDeviceGetNvLinkState = lambda h, link: 0  # links down: PCIe only  # type: ignore[method-assign]
    node = b.discover()
    g0 = node.gpus[0]
    assert g0.nvlink_domain is None and g0.nvlink_peers == []
    assert g0.topology[1] == "pcie_switch" and g0.topology[2] == "same_numa" and g0.topology[7] == "cross_socket"
    assert node.labels.get("tide.gpu.nvlink") is None  # derived labels come from with_labels


def test_telemetry_maps_nvml_units() -> None:
    b, fake = backend()
    fake.gpus[2].used, fake.gpus[2].util = 40 * 2**30, (87, 55)
    fake.gpus[2].processes = [(4242, 40 * 2**30)]
    fake.ecc[3] = 2
    fake.events.append((fake.gpus[1], 79))
    first = b.sample({})
    s = first[2]
    assert s.uuid.startswith("GPU-00000002") and s.utilization_ratio == 0.87 and s.memory_bandwidth_ratio == 0.55
    assert s.memory_used_bytes == 40 * 2**30 and s.memory_total_bytes == 85520809984
    assert s.pcie_tx_bytes_per_s == 3000 * 1024 and s.pcie_rx_bytes_per_s == 6000 * 1024
    assert s.sm_clock_hz == 1980e6 and s.power_watts == 350.5 and s.temperature_c == 41
    assert [(p.pid, p.memory_bytes) for p in s.processes] == [(4242, 40 * 2**30)]
    assert first[3].ecc_uncorrected_errors == 2
    assert first[1].xid_errors == [79] and first[0].xid_errors == []
    assert s.nvlink_tx_bytes_per_s == 0  # a rate needs two readings of the counter
    second = b.sample({})
    assert second[2].nvlink_tx_bytes_per_s > 0 and second[1].xid_errors == []
    assert b.process_memory() == {4242: 40 * 2**30}


def test_mig_enable_create_list_destroy() -> None:
    b, fake = backend()
    with pytest.raises(MigError, match="MIG mode is off on GPU 1"):
        b.create_mig(1, "1g.10gb", 0)
    b.set_mig_mode(1, True)
    assert b.mig_mode(1) and fake.calls == ["set-mig-mode 1 1"]
    u1 = b.create_mig(1, "1g.10gb", 3)
    u2 = b.create_mig(1, "3g.40gb", 4)
    u3 = b.create_mig(1, "1g.20gb", 0)
    assert "create-gi 1 19@3" in fake.calls and "create-gi 1 9@4" in fake.calls and "create-gi 1 15@0" in fake.calls
    inst = b.mig_instances(1)
    assert [(m.profile, m.start, m.uuid) for m in inst] == [("1g.20gb", 0, u3), ("1g.10gb", 3, u1), ("3g.40gb", 4, u2)]
    assert all(u.startswith("MIG-") for u in (u1, u2, u3))
    node = b.discover()
    assert node.gpus[1].mig_enabled and [m.profile for m in node.gpus[1].mig_instances] == ["1g.20gb", "1g.10gb",
                                                                                           "3g.40gb"]
    # telemetry on a MIG GPU: utilisation is not supported by NVML there, processes come per MIG device
    fake.gpus[1].gis[0].processes = [(77, 5 * 2**30)]
    s = b.sample({})[1]
    assert s.utilization_ratio == 0 and s.processes[0].pid == 77 and s.processes[0].mig_uuid == u1
    with pytest.raises(MigError, match="cannot create 1g.10gb@1"):
        b.create_mig(1, "1g.10gb", 1)  # slot 1 belongs to the 1g.20gb at 0: NVML refuses, the backend says so
    assert b.create_mig(1, "1g.10gb", 2).startswith("MIG-")
    with pytest.raises(MigError, match="cannot destroy MIG instance"):
        b.destroy_mig(1, u1)  # a process still runs in it
    fake.gpus[1].gis[0].processes = []
    b.destroy_mig(1, u1)
    assert [m.profile for m in b.mig_instances(1)] == ["1g.20gb", "1g.10gb", "3g.40gb"]
    assert "destroy-gi 1 19@3" in fake.calls
    with pytest.raises(MigError, match="has no MIG instance"):
        b.destroy_mig(1, u1)


def test_mig_refusals() -> None:
    b, fake = backend(needs_reset={4})
    with pytest.raises(MigError, match="pending a GPU reset"):
        b.set_mig_mode(4, True)
    assert fake.gpus[4].mig_pending == 0, "a refused change must not stay pending"
    fake.gpus[5].processes = [(1, 1)]
    with pytest.raises(MigError, match="running processes"):
        b.set_mig_mode(5, True)
    b.set_mig_mode(6, True)
    with pytest.raises(MigError, match="not valid on GPU 6 .H100-80GB."):
        b.create_mig(6, "1g.5gb", 0)
    with pytest.raises(MigError, match="cannot start at memory slot 1"):
        b.create_mig(6, "3g.40gb", 1)
    b.create_mig(6, "4g.40gb", 0)
    with pytest.raises(MigError, match="cannot create 3g.40gb@0"):
        b.create_mig(6, "3g.40gb", 0)
    assert set(profiles_for("H100-80GB")) >= {"1g.10gb", "7g.80gb"}
