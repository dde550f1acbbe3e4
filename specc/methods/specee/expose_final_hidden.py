"""Add the hidden state leaving the last decoder layer as a graph output.

A draft head that reads the target's top-layer features (EAGLE-style)
needs them for every verified token; this pass appends that residual
stream, before the final norm, as output `final_hidden` `[1, q, hidden]`
(role `layer_exit`) after the existing outputs. Nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from specc.graph.nodes import layer_index
from specc.graph.patterns import layer_output
from specc.graph.signature import TensorSpec, append_outputs, declared_outputs
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult
from specc.passes.expose_layer_exit import EXIT_ROLE


@dataclass(frozen=True)
class FinalHiddenConfig:
    output_name: str = "final_hidden"

    def to_json(self) -> dict:
        return {"output_name": self.output_name}


class ExposeFinalHidden(GraphPass):
    name = "expose_final_hidden"

    def __init__(self, config: FinalHiddenConfig = FinalHiddenConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        specs = declared_outputs(gm.graph)
        layers = {i for i in map(layer_index, gm.graph.nodes) if i is not None}
        if not layers or any(s.name == self.config.output_name for s in specs):
            return PassResult.unchanged(gm)
        hidden = layer_output(gm.graph, max(layers))
        append_outputs(gm.graph, [hidden],
                       [TensorSpec(self.config.output_name, EXIT_ROLE, "float", (1, "q", "hidden"))])
        tidy(gm)
        return PassResult(gm, True, inserted=[], replaced=[])
