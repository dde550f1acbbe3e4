"""What a backend is: how it lowers a named graph, at compile time and at load.

A backend is registered by name (`specc.lower.registry`) and declares its
capabilities; a method lists the capabilities it needs and never names a
backend. Every graph a backend lowers comes with its declared signature
(`specc.graph.signature`), from which it builds example inputs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.fx as fx

from specc.runtime.exactness import RowExactness, exact_rows

from specc.graph.signature import GraphSignature

# Capabilities a backend may declare:
RUN_TIME_SEGMENTS = "run_time_segments"   # lowers FX submodules (layer segments) when the engine loads
EXTRA_INPUTS = "extra_inputs"             # graphs with declared inputs beyond the decoding layout
EXTRA_OUTPUTS = "extra_outputs"           # graphs with several outputs (hidden states, extra logits)
CAPABILITIES = (RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS)


@dataclass(frozen=True)
class LoweringTarget:
    """One named graph to lower: its FX module, signature and static sizes."""

    name: str
    module: fx.GraphModule
    signature: GraphSignature
    sizes: dict[str, int]
    dtype: torch.dtype
    max_seq_len: int
    device: torch.device = torch.device("cpu")


class Backend:
    """Base class: subclasses set the class attributes and override the hooks."""

    name: str = ""
    help: str = ""
    capabilities: frozenset[str] = frozenset()
    ahead_of_time: bool = False     # `package` writes artifacts into the engine at compile time
    compiles_lazily: bool = False   # the first call per shape compiles: the loader warms graphs up
    cuda_graphs: bool = False       # on CUDA, calls replay captured CUDA graphs (`specc.lower.cuda_graphs`)
    runs_graph_weights: bool = False   # calls read the graph's own weight tensors (not a copy of its own)
    # Whether its kernels compute a row alike in calls of any row count, or need padding in
    # reduced precision: the one fact about exactness a backend declares (`specc.runtime.exactness`).
    row_exactness: RowExactness = RowExactness.ANY_ROWS

    def check_available(self) -> None:
        """Raise UsageError naming what this machine lacks (a package, a device) to use the backend."""

    def package(self, target: LoweringTarget, artifacts: Path) -> list[str]:
        """Write the graph's compiled artifacts under `artifacts`; return their file names."""
        return []

    def load(self, target: LoweringTarget, artifacts: Path, manifest: dict) -> Callable:
        """The callable that runs the graph (same inputs and outputs as the graph); the engine
        pads its calls as `row_exactness` asks (`specc.lower.row_padding.exact_calls`)."""
        raise NotImplementedError

    def generation_scope(self, run_time_segments: bool) -> contextlib.AbstractContextManager:
        """Held while an engine of this backend generates: e.g. a thread policy for the torch
        work between graph calls. `run_time_segments`: the method also runs torch-lowered
        segments (`lower_segment`), real compute for torch."""
        return contextlib.nullcontext()

    def exact_rows(self, dtype: torch.dtype) -> int | None:
        """The most query rows a call may have while every row still computes exactly
        what a one-row call computes, from the backend's `row_exactness` (`specc.runtime.exactness`);
        None when no cap is needed. Lossless engines cap their drafts at this many nodes."""
        return exact_rows(self.row_exactness, dtype)

    def lower_segment(self, segment: fx.GraphModule) -> Callable:
        """A callable for one segment (submodule) of a graph, built when the engine loads."""
        return segment
