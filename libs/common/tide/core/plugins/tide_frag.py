"""Tide's fragmentation score: FGD without its score quantisation, with packing tie-breaks.

- the fragmentation increase is used at full resolution (the reference FGD truncates a sigmoid of it
  to an integer 0..100, so placements whose frag deltas differ by tens of milli-GPU tie and are then
  picked at random, spreading work);
- among equal-fragmentation placements, prefer the tighter fit (less CPU and GPU left), which keeps
  whole idle nodes available for the large multi-GPU pods.
"""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context
from tide.core.plugins.bestfit import bestfit_raw


class TideFragScore:
    name = "tide_frag"

    def __init__(self, fit_weight: float = 0.01):
        self.fit_weight = fit_weight

    def score(self, ctx: Context) -> np.ndarray:
        delta = ctx.frag_delta()  # milli-GPU
        return -delta / 10.0 + self.fit_weight * bestfit_raw(ctx)
