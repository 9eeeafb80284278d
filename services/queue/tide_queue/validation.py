"""Turn raw submission bytes into a SubmitJob, or a rejection naming the field and the reason (pure)."""

from __future__ import annotations

import json
import math
import re

from pydantic import ValidationError
from tide.schemas.events import SCHEMA_VERSION, JobRejected, SubmitJob
from tide.schemas.job import PRIORITY_VALUES, PriorityClass
from tide.stack.auth import Tenant

_SAFE_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-")) or "payload"


def parse_submission(data: bytes, max_bytes: int, job_id_hint: str | None = None) -> SubmitJob | JobRejected:
    job_id = job_id_hint if job_id_hint and _SAFE_ID.match(job_id_hint) else None
    if len(data) > max_bytes:
        return JobRejected(job_id=job_id, field="payload", reason=f"payload of {len(data)} bytes exceeds {max_bytes}")
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return JobRejected(job_id=job_id, field="payload", reason=f"malformed JSON: {exc}")
    except RecursionError:  # deeper than Python's parser recurses: no job spec is nested like that
        return JobRejected(job_id=job_id, field="payload", reason="malformed JSON: nested too deep")
    if not isinstance(obj, dict):
        return JobRejected(job_id=job_id, field="payload", reason="expected a JSON object")
    if isinstance(obj.get("job_id"), str) and _SAFE_ID.match(obj["job_id"]):
        job_id = obj["job_id"]
    version = obj.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        return JobRejected(
            job_id=job_id,
            field="schema_version",
            reason=f"unsupported schema_version {version!r} (supported: {SCHEMA_VERSION})",
        )
    try:
        sub = SubmitJob.model_validate(obj)
    except RecursionError:
        return JobRejected(job_id=job_id, field="payload", reason="malformed JSON: nested too deep")
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = first["msg"].removeprefix("Value error, ")
        return JobRejected(job_id=job_id, field=_loc(first["loc"]), reason=f"{msg}{extra}")
    if not math.isfinite(sub.ts):  # NaN would reach Redis as a pending score it refuses, half-way through
        return JobRejected(job_id=job_id, field="ts", reason=f"submission time must be a finite number, not {sub.ts}")
    return sub


def queue_within(queue: str, allowed: list[str]) -> bool:
    """``queue`` is one of ``allowed`` or a sub-queue of one (``research`` allows ``research/nlp``)."""
    return any(queue == a or queue.startswith(a.rstrip("/") + "/") for a in allowed)


def check_tenant(sub: SubmitJob, tenant_name: str, tenant: Tenant | None) -> SubmitJob | JobRejected:
    """A tenant's submission: only to its queues, only up to its priority class (pure)."""
    meta = sub.spec.metadata
    if tenant is None:
        return JobRejected(job_id=sub.job_id, field="tenant", reason=f"unknown tenant {tenant_name!r}")
    if not queue_within(meta.queue, tenant.queues):
        return JobRejected(job_id=sub.job_id, field="metadata.queue",
                           reason=f"tenant {tenant_name!r} may not submit to queue {meta.queue!r} "
                                  f"(its queues: {', '.join(tenant.queues)})")
    if PRIORITY_VALUES[PriorityClass(meta.priority_class)] > PRIORITY_VALUES[PriorityClass(tenant.max_priority)]:
        return JobRejected(job_id=sub.job_id, field="metadata.priorityClass",
                           reason=f"tenant {tenant_name!r} may submit up to {tenant.max_priority}, "
                                  f"not {meta.priority_class}")
    return sub
