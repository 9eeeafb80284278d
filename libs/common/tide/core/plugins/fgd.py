"""Fragmentation gradient descent (FGD, ATC'23): place where the expected fragmentation, measured
against the typical pods of the recent workload, grows least.

Score = sigmoid(-delta / 1000) * 100, integer-truncated when ``quantize`` (the reference simulator
behaviour used to reproduce the published figures).
"""

from __future__ import annotations

import numpy as np
from tide.core.plugins.base import Context


class FgdScore:
    name = "fgd"
    node_local = True

    def __init__(self, quantize: bool = True):
        self.quantize = quantize

    def score(self, ctx: Context) -> np.ndarray:
        delta = ctx.frag_delta()
        s = 100.0 / (1.0 + np.exp(delta / 1000.0))
        return np.floor(s) if self.quantize else s
