"""The metrics poll's read of the cluster's usage: every node's used hash, every claim's allocation and the family
weights, as a few calls of one script (``lua/read_usage.lua``)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from redis.asyncio import Redis

from tide.store import keys

CHUNK_KEYS = 250
"""Keys per script call. Redis serves nobody else while a script runs: a call of 250 keys takes it well under a
millisecond, where one call for a 1,000-node cluster's 2,000 keys held every other client for several. The calls
go one after the other, so other clients' commands are served between them."""


@dataclass(frozen=True)
class Usage:
    used: list[dict[str, str]]
    """each node's used hash, in the order the nodes were asked for"""
    allocs: list[str | None]
    """each claim's allocation (JSON), in the order asked for; None: the claim was released meanwhile"""
    weights: dict[str, str]
    """the family weights hash (``keys.WEIGHTS``)"""


class UsageReader:
    def __init__(self, redis: Redis) -> None:
        self._read = redis.register_script(resources.files("tide.store").joinpath("lua", "read_usage.lua").read_text())

    async def read(self, node_ids: list[str], claim_keys: list[str]) -> Usage:
        hashes = [keys.WEIGHTS, *(keys.used(n) for n in node_ids)]
        everything = [*hashes, *claim_keys]
        out: list[list[str] | str | None] = []
        for start in range(0, len(everything), CHUNK_KEYS):
            chunk = everything[start:start + CHUNK_KEYS]
            out.extend(await self._read(keys=chunk, args=[max(0, min(len(hashes) - start, len(chunk)))]))
        return Usage(used=[_fields(flat) for flat in out[1:len(hashes)]],
                     allocs=[alloc if isinstance(alloc, str) and alloc else None for alloc in out[len(hashes):]],
                     weights=_fields(out[0]))


def _fields(flat: list[str] | str | None) -> dict[str, str]:
    """HGETALL's flat field/value list as a script returns it, as a dict."""
    if not isinstance(flat, list):
        return {}
    return dict(zip(flat[::2], flat[1::2], strict=True))
