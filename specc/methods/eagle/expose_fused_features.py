"""Give the target an EAGLE-3 feature output: a trained fusion of a low, a middle and a high layer.

EAGLE-3 drafts from more than the top layer: the hidden states entering three
target layers (the residual stream, as vLLM's `aux_hidden_states` take it) are
concatenated and projected back to the hidden size by one matrix,

    feature = W_fc · [h_low, h_mid, h_high]        (W_fc: [hidden, 3 · hidden], no bias)

This pass appends that feature as output `eagle_feature` `[1, q, hidden]`
(role `layer_exit`) after the logits, so every verification returns each
row's feature for the next round's draft; the logits are unchanged. `W_fc`
is a parameter of the graph (`eagle.fc.weight`), initialised to pass the high
layer's state through (`[0 | 0 | I]`: on SmolLM2 its head learned faster from
there than from the mean of the three, docs/methods/eagle.md) and trained at
compile time with the draft head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import UsageError
from specc.methods.eagle.config import default_layers
from specc.graph.nodes import layer_index, output_node
from specc.graph.patterns import layer_output, register_parameter
from specc.graph.signature import TensorSpec, append_outputs, declared_outputs
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult
from specc.passes.expose_layer_exit import EXIT_ROLE

aten = torch.ops.aten
FEATURE_OUTPUT = "eagle_feature"
FC_WEIGHT = "eagle.fc.weight"


@dataclass(frozen=True)
class FusedFeaturesConfig:
    # t: the state entering layer t (t = L: the last layer's output, before the final norm);
    # None: EAGLE-3's default
    layers: tuple[int, int, int] | None = None

    def __post_init__(self):
        if self.layers is not None and (len(self.layers) != 3 or any(t < 1 for t in self.layers)):
            raise UsageError(f"fused layers {self.layers} must be three layers, each 1 or deeper")

    def to_json(self) -> dict:
        return {"layers": None if self.layers is None else list(self.layers), "output": FEATURE_OUTPUT,
                "fc": FC_WEIGHT}

    def resolve(self, num_layers: int) -> tuple[int, int, int]:
        """The layers fused in a model of `num_layers` decoder layers."""
        layers = self.layers or default_layers(num_layers)
        if max(layers) > num_layers:
            raise UsageError(f"fused layers {list(layers)} must be at most the model's {num_layers} layers")
        return layers


class ExposeFusedFeatures(GraphPass):
    name = "expose_fused_features"

    def __init__(self, config: FusedFeaturesConfig):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        if any(spec.name == FEATURE_OUTPUT for spec in declared_outputs(gm.graph)):
            return PassResult.unchanged(gm)
        layers = self.config.resolve(model_layers(gm))
        states = [layer_output(gm.graph, t - 1) for t in layers]
        hidden = _hidden_size(states[0])
        register_parameter(gm, FC_WEIGHT, high_layer_only(hidden, _dtype(gm)))
        output = output_node(gm.graph)
        with gm.graph.inserting_before(output):
            joined = gm.graph.call_function(aten.cat.default, (states, -1))
            feature = gm.graph.call_function(aten.linear.default, (joined, gm.graph.get_attr(FC_WEIGHT)))
        append_outputs(gm.graph, [feature], [TensorSpec(FEATURE_OUTPUT, EXIT_ROLE, "float", (1, "q", "hidden"))])
        tidy(gm)
        return PassResult(gm, True, inserted=[joined.name, feature.name], replaced=[output.name],
                          added_parameters=[FC_WEIGHT])


def model_layers(gm: fx.GraphModule) -> int:
    return 1 + max(i for i in map(layer_index, gm.graph.nodes) if i is not None)


def high_layer_only(hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """[0 | 0 | I]: the untrained fusion is the high layer's state."""
    zeros = torch.zeros(hidden, hidden)
    return torch.cat([zeros, zeros, torch.eye(hidden)], dim=1).to(dtype)


def _hidden_size(state: fx.Node) -> int:
    value = state.meta.get("val")
    if value is None:
        raise UsageError(f"{state.name} carries no shape metadata; capture the graph with specc")
    return int(value.shape[-1])


def _dtype(gm: fx.GraphModule) -> torch.dtype:
    return next(p.dtype for p in gm.parameters() if p.is_floating_point())
