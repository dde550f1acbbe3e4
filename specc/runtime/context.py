"""The narrow view of a loaded engine a method builds its runtime from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from specc.capture.families import ArchitectureSummary
from specc.errors import SpeccError
from specc.graph.signature import GraphSignature, read_signature
from specc.runtime.cached_model import CachedModel
from specc.runtime.kv_cache import KVCache


@dataclass
class MethodContext:
    """A method's graphs as lowered callables, with what it needs to step them.

    `modules` are the rewritten FX graphs (to walk their segments);
    `lower_segment` lowers one segment with the engine's backend;
    `compiles_lazily` says whether first calls compile (warm up what only
    the method knows how to call); `state` is what the method's compile-time
    step stored in the manifest; `exact_rows` the most rows a call may hold
    and compute each row as a decode step does (None: any), for a runtime
    whose calls carry rows beyond the draft's."""

    graphs: dict[str, Callable]
    modules: dict[str, fx.GraphModule]
    signatures: dict[str, GraphSignature]
    architectures: dict[str, ArchitectureSummary]
    state: dict
    max_seq_len: int
    dtype: torch.dtype
    lower_segment: Callable[[fx.GraphModule], Callable]
    compiles_lazily: bool = False
    device: str = "cpu"
    exact_rows: int | None = None

    @classmethod
    def eager(cls, program, max_seq_len: int, dtype: torch.dtype = torch.float32, state: dict | None = None):
        """A context over a compiled-in-memory `SpeculativeProgram`, run eager
        (what compile-time calibration and tests use)."""
        return cls(graphs={name: g.module for name, g in program.graphs.items()},
                   modules={name: g.module for name, g in program.graphs.items()},
                   signatures={name: read_signature(g.module) for name, g in program.graphs.items()},
                   architectures={name: g.architecture for name, g in program.graphs.items()},
                   state=state or {}, max_seq_len=max_seq_len, dtype=dtype, lower_segment=lambda segment: segment)

    def model(self, name: str, cache: KVCache | None = None, forward: Callable | None = None) -> CachedModel:
        """Graph `name` (or `forward`, a callable with its signature) with a new KV
        cache, or with `cache` to share one (a self-drafting graph of the target)."""
        if name not in self.graphs:
            raise SpeccError(f"the engine has no graph {name!r}; it has {', '.join(self.graphs)}")
        return CachedModel(forward or self.graphs[name], self.signatures[name], self.architectures[name],
                           self.max_seq_len, self.dtype, self.device, cache=cache)
