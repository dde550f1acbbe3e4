"""Turn the target graph into an EAGLE-1-style draft head.

Input: a cached decoder graph. Output: the graph of a one-block draft head,

    x_t = W_fc · [embed(token_t), feature_{t-1}] + b_fc
    logits_{t+1} = LM head(final norm(decoder block(x_t)))

where `feature` (input `draft_feature`, `[1, q, hidden]`) is the target's
hidden state leaving its last decoder layer at the previous position. The
decoder block is the target's own last layer as captured (attention with
rotary positions from `position_ids`, the `attn_mask` input, MLP), with
parameters of its own under `draft_head.layer` and the final norm's under
`draft_head.norm`, initialised as copies; `W_fc` starts as [0 | I] so the
untrained head reads the feature unchanged. The head has its own KV cache
(`k_cache_draft_head`, `v_cache_draft_head`); the embedding and the LM head
stay the target's, shared and frozen. Every earlier layer is cut away.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import add_placeholder, attribute, layer_index, module_path, placeholder
from specc.graph.patterns import (LAYER_PATH, adopt_parameters, attention_of, final_norm_path, layer_output,
                                  remove_unreachable, token_embedding)
from specc.graph.signature import declare_input
from specc.graph.tidy import tidy
from specc.passes.attach_adapter_head import own_cache, relabel
from specc.passes.base import GraphPass, PassResult, new_nodes
from specc.passes.expose_layer_exit import EXIT_ROLE

aten = torch.ops.aten


@dataclass(frozen=True)
class DraftHeadConfig:
    feature_input: str = "draft_feature"
    module_name: str = "draft_head"
    cache_names: tuple[str, str] = ("k_cache_draft_head", "v_cache_draft_head")

    def to_json(self) -> dict:
        return {"feature_input": self.feature_input, "module_name": self.module_name,
                "cache_names": list(self.cache_names)}


class AttachDraftHead(GraphPass):
    name = "attach_draft_head"

    def __init__(self, config: DraftHeadConfig = DraftHeadConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        layers = {i for i in map(layer_index, graph.nodes) if i is not None}
        if not layers or placeholder(graph, self.config.feature_input) is not None:
            return PassResult.unchanged(gm)
        last = max(layers)
        if last < 1:
            raise SpeccError("an EAGLE-style draft head needs a model with at least two decoder layers")
        before = set(graph.nodes)
        embedding = token_embedding(graph)
        block_input = layer_output(graph, last - 1)
        feature = declare_input(add_placeholder(graph, self.config.feature_input), EXIT_ROLE, "float",
                                (1, "q", "hidden"))
        fc_prefix = f"{self.config.module_name}.fc"
        hidden = _hidden_size(gm, embedding)
        _register_fc(gm, fc_prefix, hidden, embedding.args[0], block_input)
        with graph.inserting_before(block_input.next):
            joined = graph.call_function(aten.cat.default, ([embedding, feature], -1))
            fc = graph.call_function(aten.linear.default, (joined, graph.get_attr(f"{fc_prefix}.weight"),
                                                            graph.get_attr(f"{fc_prefix}.bias")))
        for user in list(block_input.users):
            if layer_index(user) == last:
                user.replace_input_with(block_input, fc)
        remove_unreachable(graph)
        sdpa = attention_of(graph, last)
        layer_path = LAYER_PATH.match(module_path(sdpa)).group(1)
        norm_path = final_norm_path(layer_output(graph, last))
        renames = {layer_path: f"{self.config.module_name}.layer", norm_path: f"{self.config.module_name}.norm"}
        added_parameters = adopt_parameters(gm, renames) + [f"{fc_prefix}.weight", f"{fc_prefix}.bias"]
        added_inputs = own_cache(graph, sdpa, feature, self.config.cache_names) + [self.config.feature_input]
        relabel(graph, renames)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=[block_input.name],
                          added_parameters=added_parameters, added_inputs=added_inputs)


def _hidden_size(gm: fx.GraphModule, embedding: fx.Node) -> int:
    weight = embedding.args[0]
    if weight.op != "get_attr":
        raise SpeccError(f"the token embedding reads {weight.name}, not a weight")
    return attribute(gm, weight.target).shape[1]


def _register_fc(gm: fx.GraphModule, prefix: str, hidden: int, weight_node: fx.Node, anchor: fx.Node) -> None:
    """W_fc = [0 | I], b = 0: the untrained head passes the feature through."""
    dtype = attribute(gm, weight_node.target).dtype
    fc = torch.nn.Linear(2 * hidden, hidden, dtype=dtype)
    with torch.no_grad():
        fc.weight.zero_()
        fc.weight[:, hidden:] = torch.eye(hidden, dtype=dtype)
        fc.bias.zero_()
    fc.requires_grad_(False)
    gm.add_submodule(prefix, fc)
