"""A job's path as one OpenTelemetry trace, built from its lifecycle events.

The metrics service sees every event of a job; when the job ends it emits a ``job`` span from the
first event to the last, with children for the phases it went through (``job.wait``: queued until
placed, ``job.start``: placed until running, ``job.run``: running until the end), each attempt's
requeues and exits as span events. Exported by OTLP when ``TIDE_OTLP_ENDPOINT`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import trace
from tide import subjects

NS = 1_000_000_000
PHASES = (("job.wait", "queued", "placed"), ("job.start", "placed", "running"), ("job.run", "running", None))
TERMINAL_KINDS = frozenset(subjects.TERMINAL_EVENT_KINDS)


@dataclass
class Timeline:
    job_id: str
    queue: str = ""
    priority_class: str = ""
    first: dict[str, float] = field(default_factory=dict)  # kind -> ts of its first event
    last: dict[str, float] = field(default_factory=dict)  # kind -> ts of its latest event
    marks: list[tuple[float, str, str]] = field(default_factory=list)  # (ts, kind, reason) of other events

    def add(self, kind: str, ts: float, reason: str = "") -> None:
        self.first.setdefault(kind, ts)
        self.last[kind] = ts
        if kind not in {"queued", "placed", "running"}:
            self.marks.append((ts, kind, reason))


def emit(tracer: trace.Tracer, t: Timeline, end_kind: str, end_ts: float, attrs: dict[str, str]) -> None:
    """Emit the job's trace (root span and one child per phase it reached)."""
    start = min([*t.first.values(), end_ts])
    root = tracer.start_span("job", start_time=int(start * NS), attributes={
        "tide.job_id": t.job_id, "tide.queue": t.queue, "tide.priority_class": t.priority_class,
        "tide.outcome": end_kind, **{f"tide.{k}": v for k, v in attrs.items()}})
    ctx = trace.set_span_in_context(root)
    for name, begin, until in PHASES:
        if begin not in t.last:
            continue
        b = t.last[begin]  # the latest attempt
        e = t.last.get(until, end_ts) if until else end_ts
        if until and until in t.last and t.last[until] < b:
            e = end_ts
        span = tracer.start_span(name, context=ctx, start_time=int(b * NS), attributes={"tide.job_id": t.job_id})
        span.end(end_time=int(max(e, b) * NS))
    for ts, kind, reason in t.marks:
        root.add_event(kind, {"reason": reason} if reason else {}, timestamp=int(ts * NS))
    root.end(end_time=int(max(end_ts, start) * NS))
