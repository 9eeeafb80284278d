"""structlog set-up: JSON lines in services, a console renderer on a terminal.

Both structlog events and the standard library's log records (nats, redis, asyncio, ...) go through the
same processors and the same renderer, so a service's log is one stream of lines with the same fields:
``event``, ``level``, ``timestamp``, ``service`` (stdlib records also ``logger``), and ``trace_id`` /
``span_id`` while an OpenTelemetry span is current.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from opentelemetry import trace


def _write_line(line: str) -> None:
    """``line`` and its newline to ``sys.stderr`` in one write (``print`` writes them apart: two system calls)."""
    stream = sys.stderr
    stream.write(line + "\n")
    stream.flush()


class StderrLogger:
    """Prints to whatever ``sys.stderr`` is when a line is written (``PrintLoggerFactory(file=sys.stderr)``
    keeps the stream of the moment it was configured: a stream replaced since, e.g. closed by a test
    harness's capture, then fails every later log call)."""

    def msg(self, message: str) -> None:
        _write_line(message)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def _stderr_logger(*_args: object) -> StderrLogger:
    return StderrLogger()


class StderrHandler(logging.Handler):
    """A stdlib handler writing the formatted record to the ``sys.stderr`` of the moment (see StderrLogger)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write_line(self.format(record))
        except Exception:
            self.handleError(record)


def _fallback(obj: object) -> Any:
    """What JSON cannot hold, as structlog's ``JSONRenderer`` writes it: ``__structlog__()`` where defined, else
    ``repr``."""
    custom = getattr(obj, "__structlog__", None)
    return custom() if callable(custom) else repr(obj)


class JsonLineRenderer:
    """The lines structlog's ``JSONRenderer`` writes, with one encoder kept: ``json.dumps`` given a ``default``
    builds an encoder on each call, half of the renderer's time (5 us a line; a service logs a few lines a job)."""

    def __init__(self) -> None:
        self._encode = json.JSONEncoder(default=_fallback).encode

    def __call__(self, _logger: object, _name: str, event: MutableMapping[str, Any]) -> str:
        return self._encode(event)


def add_trace_context(_logger: object, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``trace_id`` and ``span_id`` (hex, as OTLP backends show them) of the current OpenTelemetry span."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    return event


def configure_logging(service: str, fmt: str = "json", level: str = "info") -> structlog.stdlib.BoundLogger:
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else JsonLineRenderer()
    )
    numeric_level = logging.getLevelName(level.upper())

    def add_service(_logger: object, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event.setdefault("service", service)
        return event

    shared: list[structlog.typing.Processor] = [
        add_service,
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_context,
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    # Standard library records (nats, redis, asyncio, ...; they propagate to the root logger): the same
    # processors, plus the logger's name, and the same renderer.
    handler = StderrHandler()
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.format_exc_info,
                    renderer],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, StderrHandler)]:  # configured again: replace ours only
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    return structlog.get_logger()
