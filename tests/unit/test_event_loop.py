"""The services' event loop: uvloop's by default, asyncio's own on request (``tide.runtime``, issue 17)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop
from pydantic import ValidationError
from tide.runtime import loop_factory
from tide.settings import Settings

SERVICE = """
import asyncio, sys
from pathlib import Path
from tide.runtime import run_service

class Probe:
    def __init__(self, settings):
        pass
    async def start(self):
        pass
    async def run(self, stop):
        Path(sys.argv[1]).write_text(type(asyncio.get_running_loop()).__module__)
    async def close(self):
        pass

run_service("probe", Probe)
"""


def loop_of_service(tmp_path: Path, **env: str) -> str:
    out = tmp_path / "loop"
    subprocess.run([sys.executable, "-c", SERVICE, str(out)], check=True, timeout=60,
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}, **env})
    return out.read_text()


def test_a_service_runs_on_uvloop_unless_told_otherwise(tmp_path: Path) -> None:
    assert loop_of_service(tmp_path) == "uvloop"
    assert loop_of_service(tmp_path, TIDE_EVENT_LOOP="asyncio").startswith("asyncio")


def test_the_loop_choice_is_checked() -> None:
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert loop_factory("asyncio") is None
    with pytest.raises(ValidationError, match="event_loop"):
        Settings(event_loop="trio")  # type: ignore[arg-type]
