"""The placer's node descriptions leave the garbage collector's full passes once the node set holds still
(``ClusterView.refresh`` -> ``tide.runtime.freeze_long_lived``), not at every registration or resync."""

from __future__ import annotations

import gc
import time

import pytest
from redis.asyncio import Redis
from tide.runtime import freeze_long_lived
from tide.schemas.node import default_h100_node
from tide.store.claims import ClaimStore
from tide_placer import view as view_module
from tide_placer.view import ClusterView


async def test_node_descriptions_are_frozen_once_the_node_set_holds_still(
        redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    freezes: list[int] = []

    def counted() -> None:
        freeze_long_lived()
        freezes.append(gc.get_freeze_count())

    monkeypatch.setattr(view_module, "freeze_long_lived", counted)
    claims = ClaimStore(redis)
    view = ClusterView(redis, claims, resync_s=0.05)
    await claims.set_capacity(default_h100_node("n0"))
    try:
        gc.unfreeze()
        await view.refresh([])
        assert freezes == [], "a registration: the node set may still be changing"
        time.sleep(0.06)  # a resync period with the same nodes version
        await view.refresh([])
        assert len(freezes) == 1, "the node set held still for a resync period: its descriptions are frozen"
        assert freezes[0] > 0 and not any(o is view.nodes[0] for o in gc.get_objects()), "left out of the GC"
        time.sleep(0.06)
        await view.refresh([])
        assert len(freezes) == 1, "once per nodes version"
        await claims.set_capacity(default_h100_node("n1"))  # a registration: a new version
        time.sleep(0.06)
        await view.refresh([])
        assert len(freezes) == 1
        time.sleep(0.06)
        await view.refresh([])
        assert len(freezes) == 2, "the new node set, once it held still"
        assert {n.node_id for n in view.nodes} == {"n0", "n1"}
    finally:
        gc.unfreeze()


async def test_a_periodic_resync_builds_on_the_descriptions_it_has_and_a_registration_reads_them_again(
        redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    claims = ClaimStore(redis)
    view = ClusterView(redis, claims, resync_s=0.05)
    reads: list[int] = []
    node_raws = claims.node_raws

    async def counted() -> dict[str, str]:
        reads.append(1)
        return await node_raws()

    monkeypatch.setattr(claims, "node_raws", counted)
    monkeypatch.setattr(view_module, "freeze_long_lived", lambda: None)
    await claims.set_capacity(default_h100_node("n0"))
    _, cluster, _ = await view.refresh([])
    assert len(reads) == 1 and cluster.num_nodes == 1
    before = cluster.copy()
    time.sleep(0.06)
    _, cluster, _ = await view.refresh([])
    assert len(reads) == 1, "the same nodes version: descriptions not read again"
    assert cluster is not before and (cluster.milli_free == before.milli_free).all()
    await claims.set_capacity(default_h100_node("n1"))
    _, cluster, _ = await view.refresh([])
    assert len(reads) == 2 and cluster.num_nodes == 2
    view.invalidate()
    await view.refresh([])
    assert len(reads) == 3, "a view told it is stale reads everything"
