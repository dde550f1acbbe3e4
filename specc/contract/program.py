"""The speculative program: named graphs that a method's passes produced."""

from __future__ import annotations

import copy
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
    lowered: bool = True             # False: the engine keeps its FX module (`GraphRecipe.lowered`)


@dataclass
class SpeculativeProgram:
    graphs: dict[str, ProgramGraph] = field(default_factory=dict)
    pass_records: list[PassRecord] = field(default_factory=list)
    added_weights: dict = field(default_factory=dict)   # trained parameters, by name

    def records_of(self, graph: str) -> list[PassRecord]:
        return [r for r in self.pass_records if r.graph == graph]


def graph_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A GraphModule with its own graph (passes rewrite graphs in place) over
    the same parameter tensors, so a second graph costs no weight memory."""
    return fx.GraphModule(gm, copy.deepcopy(gm.graph))
