"""Also return, after the graph's own outputs, the hidden state entering each of some layers.

A teacher that runs the frozen target once per training window may need, beside the logits,
states from inside it: FIRP's projections read the state leaving layer t - 1 for every pseudo
layer t, and `eagle` fuses the states entering a low, a middle and a high layer before its
fusion is trained. This pass appends those states to the output tuple (declared with the
`layer_input` role), so one forward gives them all; the graph is otherwise unchanged. Built
only for training (`methods/firp/train.py`, `methods/eagle/train.py`), never part of an engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from specc.errors import UsageError
from specc.graph.nodes import output_node
from specc.graph.patterns import layer_output
from specc.graph.signature import TensorSpec, append_outputs, declared_outputs
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult

LAYER_INPUT_ROLE = "layer_input"


@dataclass(frozen=True)
class LayerInputsConfig:
    layers: tuple[int, ...]     # t: return the state entering layer t (leaving layer t - 1)

    def __post_init__(self):
        if not self.layers or any(t < 1 for t in self.layers):
            raise UsageError(f"layer inputs {self.layers} must name layers 1 or deeper")

    def to_json(self) -> dict:
        return {"layers": list(self.layers)}


class ExposeLayerInputs(GraphPass):
    name = "expose_layer_inputs"

    def __init__(self, config: LayerInputsConfig):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        if any(spec.role == LAYER_INPUT_ROLE for spec in declared_outputs(gm.graph)):
            return PassResult.unchanged(gm)
        states = [layer_output(gm.graph, t - 1) for t in self.config.layers]
        append_outputs(gm.graph, states, [TensorSpec(f"layer_{t}_input", LAYER_INPUT_ROLE, "float", (1, "q", "hidden"))
                                          for t in self.config.layers])
        tidy(gm)
        return PassResult(gm, True, replaced=[output_node(gm.graph).name])
