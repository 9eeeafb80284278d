"""Ports for the servers a stack starts: unique, bindable and outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from tide.stack.servers import LOWEST_LISTEN_PORT, ephemeral_port_range, free_port


def test_free_ports_are_never_handed_out_twice_and_avoid_the_ephemeral_range() -> None:
    low, high = ephemeral_port_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    if low - LOWEST_LISTEN_PORT >= 1000:
        assert all(LOWEST_LISTEN_PORT <= p < low for p in ports), [p for p in ports if not p < low]


def test_a_port_someone_listens_on_is_not_handed_out() -> None:
    low, _high = ephemeral_port_range()
    listeners = []
    try:
        for port in range(LOWEST_LISTEN_PORT, min(low, LOWEST_LISTEN_PORT + 200)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
                listeners.append(s)
            except OSError:
                s.close()
        taken = {s.getsockname()[1] for s in listeners}
        assert taken
        assert not taken & {free_port() for _ in range(200)}
    finally:
        for s in listeners:
            s.close()
