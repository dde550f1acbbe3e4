"""`eager`: execute the rewritten FX graph itself."""

from __future__ import annotations

import torch

from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend
from specc.graph.nodes import rows_computed_alike
from specc.lower.row_padding import EXACT_ROWS, exact_in_reduced_precision, exact_rows_for


class EagerBackend(Backend):
    name = "eager"
    help = "execute the rewritten FX graph (no compilation)"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})
    cuda_graphs = True

    def load(self, target, artifacts, manifest):
        alike = rows_computed_alike(target.module) == EXACT_ROWS
        return exact_in_reduced_precision(target.module, target, rows_alike=alike)

    def exact_rows(self, dtype: torch.dtype) -> int | None:
        """bfloat16 calls of fewer rows run padded (`specc.lower.row_padding`): unpadded,
        a 2-row call's first row differed from a one-row step, enough to flip near-ties
        (docs/backends.md#measurements-behind-the-lowering-choices)."""
        return exact_rows_for(dtype)


BACKEND = EagerBackend()
