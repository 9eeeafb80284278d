"""A leader lease in Redis: one holder at a time, by token.

Taken with ``SET key token NX PX ttl``, renewed by its holder with a compare-and-renew script (the TTL is
reset only while the key still holds the holder's token), given up on a clean shutdown with a
compare-and-delete. Each acquisition draws a new token, so a holder that lost the lease and took it again
is a different holder to the fenced scripts (``tide.store.claims``).

The holder also keeps its own deadline: ``sent + ttl`` of its last successful take or renewal, ``sent`` being
its monotonic clock when it sent the command (no later than Redis started the TTL). Past the deadline it
counts itself as not leading even when it cannot reach Redis to learn so; a process that was paused
(SIGSTOP, a long GC, a frozen VM) finds its deadline passed on waking, since the monotonic clock runs on.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from dataclasses import dataclass
from importlib import resources

from redis.asyncio import Redis


@dataclass(frozen=True)
class LeaseState:
    token: str  # the token of the last acquisition ('' before the first)
    deadline: float  # monotonic; leading while now < deadline


NOT_HELD = LeaseState(token="", deadline=0.0)


def leading(state: LeaseState, now: float) -> bool:
    return bool(state.token) and now < state.deadline


def after_take(state: LeaseState, token: str, taken: bool, sent: float, ttl_s: float) -> LeaseState:
    """A take (``SET NX``) with ``token`` sent at ``sent``: held until ``sent + ttl`` if it was taken."""
    return LeaseState(token=token, deadline=sent + ttl_s) if taken else state


def after_renew(state: LeaseState, renewed: bool, sent: float, ttl_s: float) -> LeaseState:
    """A renewal sent at ``sent``: extended, or lost at once when Redis says the lease is someone else's."""
    return LeaseState(token=state.token, deadline=max(state.deadline, sent + ttl_s) if renewed else 0.0)


def transition(was: bool, now: bool) -> str | None:
    """'acquired', 'lost' or None."""
    if now and not was:
        return "acquired"
    if was and not now:
        return "lost"
    return None


def new_token(holder: str) -> str:
    return f"{holder}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class LeaderLease:
    def __init__(self, redis: Redis, key: str, holder: str, ttl_s: float, renew_s: float) -> None:
        if ttl_s < 3 * renew_s - 1e-9:
            raise ValueError(f"lease TTL {ttl_s:g} s must be at least 3 x the renewal period {renew_s:g} s")
        self.redis = redis
        self.key = key
        self.holder = holder
        self.ttl_ms = int(ttl_s * 1000)
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.state = NOT_HELD
        lua = resources.files("tide.store").joinpath("lua")
        self._renew = redis.register_script(lua.joinpath("lease_renew.lua").read_text())
        self._release = redis.register_script(lua.joinpath("lease_release.lua").read_text())

    @property
    def token(self) -> str:
        """The current token; a placeholder that matches no lease before the first acquisition."""
        return self.state.token or f"{self.holder}:never-led"

    def leading(self) -> bool:
        return leading(self.state, time.monotonic())

    def drop(self) -> None:
        """Stop counting as the leader (a fenced script refused: the lease is someone else's)."""
        self.state = LeaseState(token=self.state.token, deadline=0.0)

    async def step(self) -> None:
        """Renew while leading; otherwise try to take the lease. Each Redis call waits at most one TTL."""
        sent = time.monotonic()
        if self.leading():
            renewed = await asyncio.wait_for(self._renew(keys=[self.key], args=[self.state.token, self.ttl_ms]),
                                             timeout=self.ttl_s)
            self.state = after_renew(self.state, bool(renewed), sent, self.ttl_s)
            return
        token = new_token(self.holder)
        taken = await asyncio.wait_for(self.redis.set(self.key, token, nx=True, px=self.ttl_ms), timeout=self.ttl_s)
        self.state = after_take(self.state, token, bool(taken), sent, self.ttl_s)

    async def release(self) -> bool:
        """Give the lease up if it is still ours (clean shutdown: a standby takes over at its next try)."""
        self.state = LeaseState(token=self.state.token, deadline=0.0)
        if not self.state.token:
            return False
        return bool(await self._release(keys=[self.key], args=[self.state.token]))

    async def holder_now(self) -> str | None:
        """The token Redis holds now (any holder's), for status displays."""
        value = await self.redis.get(self.key)
        return str(value) if value else None
