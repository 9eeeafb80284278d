"""Dead letters: a message a consumer's handler failed on too often, kept in the ``DLQ`` stream with the reason.

The dead letter's body is the original payload (the first ``MAX_BODY`` bytes); its headers say where it came
from and why it was given up: the original subject, the consumer, the job (when the message names one), the
handler's error and how often it was delivered. ``tide describe JOB`` lists a job's dead letters and the
metrics service counts them (``tide_dead_letters_total{consumer}``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

from tide import subjects

MAX_BODY = 64 * 1024
MAX_ERROR = 500
_JOB_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")

H_SUBJECT = "Tide-Dlq-Subject"
H_CONSUMER = "Tide-Dlq-Consumer"
H_STREAM = "Tide-Dlq-Stream"
H_SEQ = "Tide-Dlq-Seq"
H_JOB = "Tide-Dlq-Job-Id"
H_ERROR = "Tide-Dlq-Error"
H_DELIVERIES = "Tide-Dlq-Deliveries"
H_TS = "Tide-Dlq-Ts"
H_SIZE = "Tide-Dlq-Size"


class DeadLetter(BaseModel):
    """What a dead letter's headers say (``from_headers``), the payload aside."""

    consumer: str
    subject: str
    stream: str = ""
    stream_seq: int = 0
    job_id: str | None = None
    error: str = ""
    deliveries: int = 0
    ts: float = 0.0
    size: int = 0  # the original payload's length (the body keeps at most MAX_BODY bytes of it)

    def headers(self) -> dict[str, str]:
        h = {H_SUBJECT: _header_text(self.subject, 1000), H_CONSUMER: self.consumer, H_STREAM: self.stream,
             H_SEQ: str(self.stream_seq), H_ERROR: _header_text(self.error, MAX_ERROR),
             H_DELIVERIES: str(self.deliveries), H_TS: f"{self.ts:.3f}", H_SIZE: str(self.size),
             # the same message given up twice (a redelivery racing the ack) is one dead letter
             "Nats-Msg-Id": f"dlq.{self.stream}.{self.consumer}.{self.stream_seq}"}
        if self.job_id:
            h[H_JOB] = self.job_id
        return h

    @classmethod
    def from_headers(cls, headers: dict[str, str] | None) -> DeadLetter | None:
        """None for a message that is not a dead letter (no consumer or subject header)."""
        h = headers or {}
        if not h.get(H_CONSUMER) or not h.get(H_SUBJECT):
            return None
        return cls(consumer=h[H_CONSUMER], subject=h[H_SUBJECT], stream=h.get(H_STREAM, ""),
                   stream_seq=_int(h.get(H_SEQ)), job_id=h.get(H_JOB) or None, error=h.get(H_ERROR, ""),
                   deliveries=_int(h.get(H_DELIVERIES)), ts=_float(h.get(H_TS)), size=_int(h.get(H_SIZE)))

    def dlq_subject(self) -> str:
        return subjects.dead_letter(self.consumer, self.job_id)


def job_id_of(data: bytes, headers: dict[str, str] | None) -> str | None:
    """The job a message speaks of, if it names one that can be a subject token: the ``Tide-Job-Id`` header,
    else the JSON body's ``job_id``. Never raises, whatever the bytes."""
    candidates: list[Any] = [(headers or {}).get("Tide-Job-Id")]
    try:
        body = json.loads(data)
        if isinstance(body, dict):
            candidates.append(body.get("job_id"))
    except Exception:  # noqa: BLE001 - malformed, not UTF-8, nested too deep: no job id then
        pass
    for c in candidates:
        if isinstance(c, str) and is_job_token(c):
            return c
    return None


def is_job_token(job_id: str) -> bool:
    return bool(_JOB_TOKEN.match(job_id))


def describe_error(exc: BaseException) -> str:
    """One line naming the exception: ``Type: text``."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _header_text(text: str, limit: int) -> str:
    """A header value: printable ASCII, one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return "".join(ch if " " <= ch <= "~" else "?" for ch in flat)[:limit]


def _int(v: str | None) -> int:
    try:
        return int(v or 0)
    except ValueError:
        return 0


def _float(v: str | None) -> float:
    try:
        return float(v or 0.0)
    except ValueError:
        return 0.0
