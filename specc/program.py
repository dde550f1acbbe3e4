"""The speculative program: named graphs that a method's passes produced."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx

from specc.capture.families import ArchitectureSummary
from specc.passes.manager import PassRecord


@dataclass
class ProgramGraph:
    name: str
    source: str                      # which captured model: "target" or "draft"
    module: fx.GraphModule
    architecture: ArchitectureSummary
    captured_text: str = ""          # the graph as captured, before any pass


@dataclass
class SpeculativeProgram:
    graphs: dict[str, ProgramGraph] = field(default_factory=dict)
    pass_records: list[PassRecord] = field(default_factory=list)
    added_weights: dict = field(default_factory=dict)   # trained parameters, by name
