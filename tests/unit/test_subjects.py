"""Subject names the services parse (tide.subjects)."""

from __future__ import annotations

from tide import subjects


def test_a_heartbeat_subject_of_either_kind_names_its_node_and_nothing_else_does() -> None:
    assert subjects.heartbeat_node(subjects.heartbeat("n7")) == "n7"
    assert subjects.heartbeat_node(subjects.telemetry("n7")) == "n7"  # a beat with GPU samples
    for other in ("tide.heartbeat.", "tide.telemetry.", "tide.heartbeat.n7.x", "tide.telemetry.n7.x",
                  subjects.node_status("n7"), "tide.heartbeats.n7", "heartbeat.n7"):
        assert subjects.heartbeat_node(other) is None, other
