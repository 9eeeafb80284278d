"""Random: uniform random scores (a lower bound to compare against)."""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context


class RandomScore:
    name = "random"
    node_local = False  # random: never cached per node

    def score(self, ctx: Context) -> np.ndarray:
        # one draw per node so that every GPU of a node shares the node's luck
        draws = ctx.rng.random(ctx.cluster.num_nodes)
        scores: np.ndarray = draws[ctx.cand.node] * 100.0
        return scores
