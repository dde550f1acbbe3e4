"""Cut a decoder graph at the exit of layer `l`: keep the shallow or the deep side.

Self-speculative methods draft from the hidden state after the first `l`
decoder layers (the *exit*) and verify by running only layers l..L-1 on
stored exits, so each token's shallow layers run once. This pass makes
either side a graph of its own:

- `keep="shallow"`: the graph outputs the exit `(hidden [1, q, hidden],)`;
  layers l.. and the head are removed.
- `keep="deep"`: the exit becomes the last graph input `exit_hidden`
  `[1, q, hidden]`; the embedding and layers 0..l-1 are removed.

Both keep every cache input (the unused ones too), so they run on the
target's full cache list; cache writes of removed layers are removed with
them. `input_ids` stays the first input: the attention reshapes read the
query length from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from specc.errors import UsageError
from specc.graph.nodes import add_placeholder, layer_index, output_node, placeholder
from specc.graph.patterns import layer_output, remove_unreachable
from specc.graph.signature import TensorSpec, declare_input, declare_outputs
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult

EXIT_ROLE = "layer_exit"
KEEP = ("shallow", "deep")


def default_exit_layer(num_layers: int) -> int:
    """The paper's 2 of 32 layers, scaled: max(1, round(L / 16))."""
    return max(1, round(num_layers / 16))


@dataclass(frozen=True)
class LayerExitConfig:
    layer: int | None = None      # None: default_exit_layer(L)
    keep: str = "shallow"
    input_name: str = "exit_hidden"

    def __post_init__(self):
        if self.keep not in KEEP:
            raise UsageError(f"layer exit keep={self.keep!r} is not one of {', '.join(KEEP)}")
        if self.layer is not None and self.layer < 1:
            raise UsageError(f"exit layer {self.layer} must be at least 1 (the number of shallow layers)")

    def to_json(self) -> dict:
        return {"layer": self.layer, "keep": self.keep, "input_name": self.input_name}


class ExposeLayerExit(GraphPass):
    name = "expose_layer_exit"

    def __init__(self, config: LayerExitConfig = LayerExitConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        layers = {i for i in map(layer_index, gm.graph.nodes) if i is not None}
        if not layers or self._already_cut(gm.graph):
            return PassResult.unchanged(gm)
        exit_layer = resolve_exit_layer(self.config.layer, max(layers) + 1)
        exit_node = layer_output(gm.graph, exit_layer - 1)
        if self.config.keep == "shallow":
            exit_node.meta["specc_role"] = EXIT_ROLE
            output_node(gm.graph).args = ((exit_node,),)
            declare_outputs(gm.graph, [TensorSpec(self.config.input_name, EXIT_ROLE, "float", (1, "q", "hidden"))])
            added = []
        else:
            hidden = declare_input(add_placeholder(gm.graph, self.config.input_name), EXIT_ROLE, "float",
                                   (1, "q", "hidden"))
            hidden.meta["specc_role"] = EXIT_ROLE
            exit_node.replace_all_uses_with(hidden)
            added = [self.config.input_name]
        remove_unreachable(gm.graph)
        tidy(gm)
        return PassResult(gm, True, inserted=added, replaced=[exit_node.name], added_inputs=added)

    def _already_cut(self, graph: fx.Graph) -> bool:
        if self.config.keep == "deep":
            return placeholder(graph, self.config.input_name) is not None
        outputs = output_node(graph).args[0]
        return any(isinstance(o, fx.Node) and o.meta.get("specc_role") == EXIT_ROLE for o in outputs)


def resolve_exit_layer(layer: int | None, num_layers: int) -> int:
    exit_layer = default_exit_layer(num_layers) if layer is None else layer
    if not 1 <= exit_layer < num_layers:
        raise UsageError(
            f"exit layer {exit_layer} leaves no layers to verify with: a {num_layers}-layer model needs "
            f"1 <= exit_layer <= {num_layers - 1}; set exit_layer to a value in that range"
        )
    return exit_layer




