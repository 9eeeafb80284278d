"""The Go runtime's threads of the NATS servers a stack starts (tide.stack.servers.nats_server_env)."""

from __future__ import annotations

import pytest
from tide.stack.servers import StackError, nats_server_env


def test_one_thread_unless_told_otherwise_and_zero_leaves_the_go_default() -> None:
    assert nats_server_env({}) == {"GOMAXPROCS": "1"}
    assert nats_server_env({"TIDE_NATS_GOMAXPROCS": "4"}) == {"GOMAXPROCS": "4"}
    assert nats_server_env({"TIDE_NATS_GOMAXPROCS": " 2 "}) == {"GOMAXPROCS": "2"}
    assert nats_server_env({"TIDE_NATS_GOMAXPROCS": "0"}) == {}
    assert nats_server_env({"GOMAXPROCS": "8"}) == {"GOMAXPROCS": "1"}  # the stack's setting, not Go's variable


@pytest.mark.parametrize("bad", ["two", "-1", "1.5", ""])
def test_a_value_that_is_not_a_whole_number_is_refused_with_the_variable_named(bad: str) -> None:
    with pytest.raises(StackError, match="TIDE_NATS_GOMAXPROCS"):
        nats_server_env({"TIDE_NATS_GOMAXPROCS": bad})
