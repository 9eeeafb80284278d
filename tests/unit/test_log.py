"""tide.log: structlog events and stdlib records (nats, redis, asyncio) come out as the same JSON lines, with
the current OpenTelemetry span's trace_id and span_id."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider
from tide.log import JsonLineRenderer, StderrHandler, configure_logging

COMMON = {"event", "level", "timestamp", "service"}


@pytest.fixture
def json_logging() -> Iterator[None]:
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("svc", "json", "info")
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**saved)


def lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.strip()]


def test_stdlib_records_of_nats_redis_and_asyncio_are_json_lines_like_structlog_events(
    json_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    structlog.get_logger().info("placed", job_id="j1")
    logging.getLogger("nats.aio.client").error("nats: encountered error %s", "timeout")
    logging.getLogger("redis.asyncio.connection").warning("connection lost")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    logging.getLogger("nats").debug("below the level: dropped")
    out = lines(capsys.readouterr().err)
    assert [e["event"] for e in out] == ["placed", "nats: encountered error timeout", "connection lost",
                                         "Task exception was never retrieved"]
    for e in out:
        assert COMMON <= set(e), e
        assert e["service"] == "svc"
    assert out[0]["job_id"] == "j1" and out[0]["level"] == "info"
    assert [(e["logger"], e["level"]) for e in out[1:]] == [
        ("nats.aio.client", "error"), ("redis.asyncio.connection", "warning"), ("asyncio", "error")]
    assert "RuntimeError: boom" in out[3]["exception"]
    assert sum(isinstance(h, StderrHandler) for h in logging.getLogger().handlers) == 1
    configure_logging("svc", "json", "info")  # configured again: still one handler, no duplicate lines
    assert sum(isinstance(h, StderrHandler) for h in logging.getLogger().handlers) == 1


def test_every_event_carries_the_current_spans_trace_and_span_ids(
    json_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    tracer = TracerProvider().get_tracer("test")
    structlog.get_logger().info("outside")
    with tracer.start_as_current_span("placing") as span:
        structlog.get_logger().info("inside")
        logging.getLogger("redis").warning("retrying")
        with tracer.start_as_current_span("child") as child:
            structlog.get_logger().info("nested")
    outside, inside, stdlib, nested = lines(capsys.readouterr().err)
    ctx, child_ctx = span.get_span_context(), child.get_span_context()
    assert "trace_id" not in outside and "span_id" not in outside
    for e in (inside, stdlib):
        assert e["trace_id"] == f"{ctx.trace_id:032x}" and e["span_id"] == f"{ctx.span_id:016x}", e
    assert nested["trace_id"] == f"{ctx.trace_id:032x}" and nested["span_id"] == f"{child_ctx.span_id:016x}"


class _Writes:
    """A stream that keeps each write call apart."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_line_is_one_write_with_its_newline(json_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy service logs a few lines per job: each one costs one system call, not one for the text and another
    for its newline."""
    stream = _Writes()
    monkeypatch.setattr("sys.stderr", stream)
    structlog.get_logger().info("placed", job_id="j1")
    logging.getLogger("redis").warning("retrying")
    assert len(stream.calls) == 2 and all(call.endswith("}\n") for call in stream.calls)
    assert [json.loads(call)["event"] for call in stream.calls] == ["placed", "retrying"]


class _Custom:
    def __structlog__(self) -> str:
        return "custom!"


def test_lines_are_what_structlogs_json_renderer_writes() -> None:
    """The kept encoder changes nothing in the lines: the same JSON, the same fallbacks for what JSON cannot
    hold, the same escapes."""
    event = {"event": "placed", "job_id": "j\u00e9\"1", "pods": [0, 1], "ratio": 0.5, "none": None,
             "path": __import__("pathlib").Path("/x"), "custom": _Custom(), "nested": {"set": {1}}}
    ours = JsonLineRenderer()(None, "info", dict(event))
    theirs = structlog.processors.JSONRenderer()(None, "info", dict(event))
    assert ours == theirs
    assert json.loads(ours)["custom"] == "custom!" and json.loads(ours)["path"] == "PosixPath('/x')"
