"""structlog set-up: JSON lines in services, a console renderer on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


class StderrLogger:
    """Prints to whatever ``sys.stderr`` is when a line is written (``PrintLoggerFactory(file=sys.stderr)``
    keeps the stream of the moment it was configured: a stream replaced since, e.g. closed by a test
    harness's capture, then fails every later log call)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def _stderr_logger(*_args: object) -> StderrLogger:
    return StderrLogger()


def configure_logging(service: str, fmt: str = "json", level: str = "info") -> structlog.stdlib.BoundLogger:
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    def add_service(_logger: object, _name: str, event: dict[str, object]) -> dict[str, object]:
        event.setdefault("service", service)
        return event

    structlog.configure(
        processors=[
            add_service,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    return structlog.get_logger()
