"""First fit: the first node in node order that fits, and on it the lowest-indexed GPU with room.

The "no placement policy" baseline (what a plain scheduler without packing does): every node scores
the same, so the placer's tie-break (first node in node order) decides; inside a node, a share goes to
the lowest GPU index that has room rather than to the fullest one.
"""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context


class FirstFitScore:
    name = "firstfit"
    node_local = True

    def score(self, ctx: Context) -> np.ndarray:
        return -np.maximum(ctx.cand.gpu, 0).astype(float) * 1e-3
