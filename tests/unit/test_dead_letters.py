"""Dead-letter headers and the give-up rule (tide.bus.dead_letters, tide.bus.nats)."""

from __future__ import annotations

import pytest
from tide import subjects
from tide.bus.dead_letters import DeadLetter, describe_error, job_id_of
from tide.bus.nats import TRANSIENT, dead_letter_after
from tide.store.claims import FencedOut


def test_headers_round_trip_and_stay_one_printable_line() -> None:
    letter = DeadLetter(consumer="queue-intake", subject="tide.jobs.submit", stream="JOBS", stream_seq=7, job_id="j-1",
                        error=describe_error(ValueError("bad\r\nline ☃")), deliveries=5, ts=12.5, size=3)
    headers = letter.headers()
    assert headers["Tide-Dlq-Error"] == "ValueError: bad line ?"
    assert headers["Nats-Msg-Id"] == "dlq.JOBS.queue-intake.7"
    back = DeadLetter.from_headers(headers)
    assert back == letter.model_copy(update={"error": "ValueError: bad line ?"})
    assert letter.dlq_subject() == "tide.dlq.queue-intake.j-1"
    assert DeadLetter.from_headers({"Other": "x"}) is None


@pytest.mark.parametrize(("data", "headers", "expected"), [
    (b'{"job_id": "abc"}', None, "abc"),
    (b'{"job_id": "a.b"}', None, None),  # not one subject token
    (b'{"job_id": "x"}', {"Tide-Job-Id": "hdr"}, "hdr"),
    (b"[" * 5000, None, None),  # RecursionError inside: no job
    (b"\xff", None, None),
    (b"[1]", None, None),
])
def test_job_id_of_never_raises(data: bytes, headers: dict | None, expected: str | None) -> None:
    assert job_id_of(data, headers) == expected
    assert subjects.dead_letter("c", expected) == f"tide.dlq.c.{expected or '_'}"


def test_limit_and_transient_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    cdef = subjects.QUEUE_INTAKE
    monkeypatch.delenv("TIDE_DEAD_LETTER_AFTER", raising=False)
    assert dead_letter_after(cdef) == 5 < cdef.max_deliver
    monkeypatch.setenv("TIDE_DEAD_LETTER_AFTER", "99")
    assert dead_letter_after(cdef) == cdef.max_deliver
    assert isinstance(FencedOut("x"), TRANSIENT) and isinstance(ConnectionError(), TRANSIENT)
    assert not isinstance(ValueError(), TRANSIENT) and not isinstance(RecursionError(), TRANSIENT)
