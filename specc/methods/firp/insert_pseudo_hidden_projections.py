"""Give a decoder graph FIRP's pseudo hidden states: at the exit of layer t_i,
rows flagged as step i take a trained linear map of another row's state.

FIRP (Wu et al., 2024) predicts the hidden state of the token i steps ahead
from a real token's hidden state after t_i layers, h̃ = W_i h + b_i, and
lets that *pseudo* state run through the remaining layers, attending to the
context and to earlier pseudo states, to be decoded by the target's own LM
head. Here every row runs every layer (the sequence length never changes
inside the graph): two inputs, appended after the caches, say what each row is

- `pseudo_source [1, q]` (long): the row whose state a pseudo row derives
  from (a real row points to itself);
- `pseudo_step [1, q]` (long): 0 for a real row, i for a pseudo row of step i;

and after the exit of layer t_i the residual stream becomes
`where(pseudo_step == i, linear(index_select(h, pseudo_source), W_i, b_i), h)`.
Below t_i a pseudo row carries a throw-away state; the runtime's attention
mask keeps every real row from reading it, and a pseudo row of a later step
j (t_j ≥ t_i) reads an earlier one only where that one is already a pseudo
state. With no pseudo rows the graph computes exactly the target.

Parameters `firp_proj.<i>.weight [hidden, hidden]` / `.bias [hidden]`, one
per step i = 1..k, start at the identity and zero. Layers t_1 ≤ … ≤ t_k count
decoder layers below the projection (t = 15 projects the state leaving the
15th layer); the default is the paper's 15/20/25 of 32 layers, scaled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import add_placeholder, attention_nodes, layer_index, placeholder
from specc.graph.patterns import is_cached_attention, layer_output, register_parameter
from specc.graph.signature import declare_input
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes

PSEUDO_SOURCE_ROLE = "pseudo_source"
PSEUDO_STEP_ROLE = "pseudo_step"
PROJECTION_ROLE = "pseudo_projection"   # specc_role of the nodes this pass adds
PAPER_LAYERS = (15, 20, 25)             # FIRP on 32-layer 7B models, k = 3
PAPER_DEPTH = 32


def default_pseudo_layers(num_layers: int, steps: int = 3) -> tuple[int, ...]:
    """The paper's 15/20/25 of 32 layers scaled to the model's depth (extended by
    the paper's stride of 5 for k > 3), each in 1..L-1 and non-decreasing."""
    paper = [PAPER_LAYERS[i] if i < len(PAPER_LAYERS) else PAPER_LAYERS[-1] + 5 * (i - 2) for i in range(steps)]
    layers, previous = [], 1
    for t in paper:
        scaled = min(max(round(t * num_layers / PAPER_DEPTH), previous), num_layers - 1)
        layers.append(max(scaled, 1))
        previous = layers[-1]
    return tuple(layers)


def check_pseudo_layers(layers: tuple[int, ...], num_layers: int) -> None:
    ok = all(1 <= t <= num_layers - 1 for t in layers) and list(layers) == sorted(layers)
    if not layers or not ok:
        raise UsageError(
            f"layers={','.join(map(str, layers))}: a {num_layers}-layer model needs non-decreasing layers "
            f"1 <= t_1 <= ... <= t_k <= {num_layers - 1} (decoder layers below each step's projection)"
        )


@dataclass(frozen=True)
class PseudoHiddenConfig:
    layers: tuple[int, ...] = ()     # t_1..t_k; () = default_pseudo_layers(L, steps)
    steps: int = 3                   # k, when layers is not given
    source_input: str = "pseudo_source"
    step_input: str = "pseudo_step"
    module_name: str = "firp_proj"

    def __post_init__(self):
        if self.layers and list(self.layers) != sorted(self.layers):
            raise UsageError(f"layers={','.join(map(str, self.layers))} must be non-decreasing (t_1 <= t_2 ...)")
        if not self.layers and self.steps < 1:
            raise UsageError(f"steps={self.steps} must be at least 1")

    def resolve(self, num_layers: int) -> tuple[int, ...]:
        layers = self.layers or default_pseudo_layers(num_layers, self.steps)
        check_pseudo_layers(layers, num_layers)
        return layers

    def to_json(self) -> dict:
        return {"layers": list(self.layers), "steps": self.steps, "source_input": self.source_input,
                "step_input": self.step_input, "module_name": self.module_name}


class InsertPseudoHiddenProjections(GraphPass):
    name = "insert_pseudo_hidden_projections"

    def __init__(self, config: PseudoHiddenConfig = PseudoHiddenConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        layers = {i for i in map(layer_index, graph.nodes) if i is not None}
        if not layers or placeholder(graph, self.config.step_input) is not None:
            return PassResult.unchanged(gm)
        if any(not is_cached_attention(n) for n in attention_nodes(graph)):
            raise SpeccError("insert_pseudo_hidden_projections appends its inputs after the KV caches: "
                             "run insert_kv_cache first")
        exits = self.config.resolve(max(layers) + 1)
        before = set(graph.nodes)
        source = declare_input(add_placeholder(graph, self.config.source_input), PSEUDO_SOURCE_ROLE, "int64",
                               (1, "q"))
        step = declare_input(add_placeholder(graph, self.config.step_input), PSEUDO_STEP_ROLE, "int64", (1, "q"))
        hidden_size = layer_output(graph, exits[0] - 1).meta["val"].shape[-1]
        added, rewired = [], []
        for i, t in enumerate(exits, start=1):
            exit_node = layer_output(graph, t - 1)
            rewired.append(exit_node.name)
            added += self._project(gm, exit_node, source, step, i, hidden_size)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=rewired, added_parameters=added,
                          added_inputs=[self.config.source_input, self.config.step_input])

    def _project(self, gm: fx.GraphModule, hidden: fx.Node, source: fx.Node, step: fx.Node, i: int,
                 hidden_size: int) -> list[str]:
        """Rows of step `i` take W_i h[source] + b_i right after `hidden`, the layer's exit."""
        graph = gm.graph
        weight_name, bias_name = f"{self.config.module_name}.{i}.weight", f"{self.config.module_name}.{i}.bias"
        dtype = hidden.meta["val"].dtype
        register_parameter(gm, weight_name, torch.eye(hidden_size, dtype=dtype))
        register_parameter(gm, bias_name, torch.zeros(hidden_size, dtype=dtype))
        with graph.inserting_before(hidden.next):
            weight = graph.get_attr(weight_name)
            bias = graph.get_attr(bias_name)
            rows = graph.call_function(torch.ops.aten.select.int, (source, 0, 0))
            gathered = graph.call_function(torch.ops.aten.index_select.default, (hidden, 1, rows))
            pseudo = graph.call_function(torch.ops.aten.linear.default, (gathered, weight, bias))
            flags = graph.call_function(torch.ops.aten.eq.Scalar, (step, i))
            column = graph.call_function(torch.ops.aten.unsqueeze.default, (flags, -1))
            chosen = graph.call_function(torch.ops.aten.where.self, (column, pseudo, hidden))
        hidden.replace_all_uses_with(chosen, delete_user_cb=lambda user: user not in (gathered, chosen))
        for node in (weight, bias, rows, gathered, pseudo, flags, column, chosen):
            # The layer's own metadata: the projected state is what leaves layer t_i - 1 now.
            node.meta["nn_module_stack"] = dict(hidden.meta.get("nn_module_stack") or {})
            node.meta["specc_role"] = PROJECTION_ROLE
        chosen.meta["val"] = hidden.meta.get("val")
        return [weight_name, bias_name]
