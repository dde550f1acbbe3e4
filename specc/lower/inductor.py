"""`inductor`: torch.compile each graph when the engine loads."""

from __future__ import annotations

import torch

from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend
from specc.lower.row_padding import exact_in_reduced_precision, exact_rows_for


# Round where eager rounds: otherwise a fused kernel keeps bfloat16 intermediates in float32, and
# how it fuses depends on the graph's outputs, so a method's target graph (with an extra output)
# gave other bfloat16 logits than the plain target graph's (a wide random llama: up to 0.125
# apart, 1 to 3 of 10 prompts decoded identically). No effect in float32.
EXACT_ROUNDING = {"emulate_precision_casts": True}


def compile_dynamic(module):
    # Inductor compiles lazily, on the first call per shape family (q = 1 and q > 1).
    return torch.compile(module, dynamic=True, fullgraph=True, options=EXACT_ROUNDING)


class InductorBackend(Backend):
    name = "inductor"
    help = "compile each graph with torch.compile (Inductor) when the engine loads"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})
    cuda_graphs = True
    compiles_lazily = True

    def load(self, target, artifacts, manifest):
        return exact_in_reduced_precision(compile_dynamic(target.module), target)

    def exact_rows(self, dtype: torch.dtype) -> int | None:
        """bfloat16 calls of fewer rows run padded, as under eager (`specc.lower.row_padding`)."""
        return exact_rows_for(dtype)

    def lower_segment(self, segment):
        return compile_dynamic(segment)


BACKEND = InductorBackend()
