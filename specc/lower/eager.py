"""`eager`: execute the rewritten FX graph itself."""

from __future__ import annotations

from specc.runtime.exactness import RowExactness
from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend


class EagerBackend(Backend):
    name = "eager"
    help = "execute the rewritten FX graph (no compilation)"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})
    cuda_graphs = True
    runs_graph_weights = True
    # bfloat16 calls of fewer rows run padded: unpadded, a 2-row call's first row differed from a
    # one-row step, enough to flip near-ties (docs/backends.md#measurements-behind-the-lowering-choices).
    # It runs the graph as written, so a graph that pads its own attention rows runs as called.
    row_exactness = RowExactness.PADDED_UNLESS_ALIKE

    def load(self, target, artifacts, manifest):
        return target.module


BACKEND = EagerBackend()
