"""First fit: the first node in node order that fits, and on it the lowest-indexed GPU with room.

The "no placement policy" baseline (what a plain scheduler without packing does): the score is minus
the candidate's position (node index, then GPU index), so the first feasible node in node order wins
and, inside it, a share goes to the lowest GPU index with room rather than to the fullest GPU.
"""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context


class FirstFitScore:
    name = "firstfit"
    node_local = True

    def score(self, ctx: Context) -> np.ndarray:
        # node order first, then GPU index (the score depends only on the candidate's position)
        scores: np.ndarray = -(ctx.cand.node.astype(float) * 64.0 + np.maximum(ctx.cand.gpu, 0))
        return scores
