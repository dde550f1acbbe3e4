"""`inductor`: torch.compile each graph when the engine loads."""

from __future__ import annotations

import itertools

import torch

from specc.runtime.exactness import RowExactness
from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend
from specc.lower.exact_rounding import exact_rounding


def compile_dynamic(module: torch.nn.Module, device: torch.device | None = None):
    """`module` under `torch.compile`, for `device` (default: where its weights are).
    Inductor compiles lazily, on the first call per shape family (q = 1 and q > 1)."""
    device = device if device is not None else weights_device(module)
    return torch.compile(module, dynamic=True, fullgraph=True, options=exact_rounding(device))


def weights_device(module: torch.nn.Module) -> torch.device:
    """Where `module`'s first parameter or buffer lives; the CPU for a module with neither."""
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


class InductorBackend(Backend):
    name = "inductor"
    help = "compile each graph with torch.compile (Inductor) when the engine loads"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})
    cuda_graphs = True
    runs_graph_weights = True
    compiles_lazily = True

    row_exactness = RowExactness.PADDED   # bfloat16 calls of fewer rows run padded, as under eager

    def load(self, target, artifacts, manifest):
        return compile_dynamic(target.module, target.device)

    def lower_segment(self, segment):
        return compile_dynamic(segment)


BACKEND = InductorBackend()
