"""Turn the target graph into an EAGLE-3 draft head.

Input: a cached decoder graph. Output: the graph of EAGLE-3's one-layer
draft model (its `midlayer`), for a token at position t and the feature of
position t - 1 (input `eagle_feature` `[1, q, hidden]`: the target's fused
feature for committed positions, the head's own `eagle_hidden` while it
drafts ahead):

    x      = [input_norm(embed(token_t)), hidden_norm(feature)]     (2 · hidden wide)
    h      = feature + o_proj(attention(q_proj(x), k_proj(x), v_proj(x)))
    hidden = h + mlp(post_attention_norm(h))                         → output `eagle_hidden`
    logits = LM head(final norm(hidden))                             → output `logits`

The block is the target's own last decoder layer as captured (rotary
positions from `position_ids`, the `attn_mask` input, the family's MLP),
with parameters of its own under `eagle.midlayer` and the final norm's under
`eagle.norm`, initialised as copies. Its attention projections read the
2·hidden-wide `x`, so they become new parameters `[out, 2 · hidden]`,
initialised as `[W/2 | W/2]` (the layer's own projection of the mean of the
two normalised inputs); the embedding's norm is a copy of the layer's input
norm under `eagle.midlayer.input_layernorm`, and the layer's input norm, now
applied to the feature, is `eagle.midlayer.hidden_norm` (EAGLE-3's names,
so `specc export --format eagle3` maps them one to one). The head has its
own KV cache (`k_cache_eagle`, `v_cache_eagle`); the embedding and the LM
head stay the target's, shared and frozen (the LM head is cut to the draft
vocabulary after training). Every earlier layer is cut away.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import add_placeholder, attribute, layer_index, module_path, placeholder
from specc.graph.patterns import (LAYER_PATH, adopt_parameters, attention_of, final_norm_path, layer_output,
                                  register_parameter, remove_unreachable, token_embedding)
from specc.graph.signature import TensorSpec, append_outputs, declare_input
from specc.graph.tidy import tidy
from specc.passes.attach_adapter_head import own_cache, relabel
from specc.passes.base import GraphPass, PassResult, new_nodes
from specc.methods.eagle.expose_fused_features import FEATURE_OUTPUT
from specc.passes.expose_layer_exit import EXIT_ROLE

aten = torch.ops.aten
MODULE = "eagle"
FEATURE_INPUT = FEATURE_OUTPUT   # the head reads the target's fused feature under the same name
HIDDEN_OUTPUT = "eagle_hidden"
CACHE_NAMES = ("k_cache_eagle", "v_cache_eagle")


@dataclass(frozen=True)
class EagleHeadConfig:
    def to_json(self) -> dict:
        return {"module": MODULE, "feature_input": FEATURE_INPUT, "hidden_output": HIDDEN_OUTPUT,
                "cache_names": list(CACHE_NAMES)}


class AttachEagleHead(GraphPass):
    name = "attach_eagle_head"

    def __init__(self, config: EagleHeadConfig = EagleHeadConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        layers = {i for i in map(layer_index, graph.nodes) if i is not None}
        if not layers or placeholder(graph, FEATURE_INPUT) is not None:
            return PassResult.unchanged(gm)
        last = max(layers)
        if last < 1:
            raise SpeccError("an EAGLE draft head needs a model with at least two decoder layers")
        before = set(graph.nodes)
        sdpa = attention_of(graph, last)
        layer_path = LAYER_PATH.match(module_path(sdpa)).group(1)
        embedding = token_embedding(graph)
        block_input = layer_output(graph, last - 1)
        feature = declare_input(add_placeholder(graph, FEATURE_INPUT), EXIT_ROLE, "float", (1, "q", "hidden"))
        for user in list(block_input.users):
            if layer_index(user) == last:
                user.replace_input_with(block_input, feature)
        projections = _attention_projections(graph, layer_path)
        hidden_normed = _single_input(projections, layer_path)
        embed_norm = f"{MODULE}.midlayer.input_layernorm.weight"
        embed_normed = _copy_norm(gm, hidden_normed, feature, embedding, embed_norm)
        with graph.inserting_before(embed_normed.next):
            joined = graph.call_function(aten.cat.default, ([embed_normed, hidden_normed], -1))
        joined.meta["nn_module_stack"] = dict(sdpa.meta.get("nn_module_stack", {}))
        for projection in projections:
            projection.replace_input_with(hidden_normed, joined)
        block_output = layer_output(graph, last)
        _expose_hidden(graph, block_output)
        remove_unreachable(graph)
        norm_path = final_norm_path(block_output)
        input_norm = module_path(hidden_normed)
        renames = {input_norm: f"{MODULE}.midlayer.hidden_norm", layer_path: f"{MODULE}.midlayer",
                   norm_path: f"{MODULE}.norm"}
        added = adopt_parameters(gm, renames)
        added += [embed_norm] + _widen(gm, projections)
        added_inputs = own_cache(graph, sdpa, feature, CACHE_NAMES) + [FEATURE_INPUT]
        relabel(graph, renames)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=[block_input.name],
                          added_parameters=added, added_inputs=added_inputs)


def _attention_projections(graph: fx.Graph, layer_path: str) -> list[fx.Node]:
    """The layer's q/k/v projections (one fused qkv linear in some families): the linears of its
    attention that read the normalised layer input rather than the attention's output."""
    attention = f"{layer_path}.self_attn"
    linears = [n for n in graph.nodes if n.op == "call_function" and n.target == aten.linear.default
               and module_path(n).startswith(attention + ".")]
    inputs = [n for n in linears if module_path(n.args[0]) != attention and not
              module_path(n.args[0]).startswith(attention + ".")]
    if not inputs:
        raise SpeccError(f"found no attention projection reading the input of {layer_path}")
    return inputs


def _single_input(projections: list[fx.Node], layer_path: str) -> fx.Node:
    sources = {p.args[0] for p in projections}
    if len(sources) != 1:
        raise SpeccError(f"the attention projections of {layer_path} read {len(sources)} different inputs")
    return sources.pop()


def _copy_norm(gm: fx.GraphModule, normed: fx.Node, source: fx.Node, replacement: fx.Node, weight: str) -> fx.Node:
    """A copy of the norm that turns `source` into `normed`, applied to `replacement` with a
    weight of its own (`weight`, a copy of the norm's)."""
    graph = gm.graph
    path = module_path(normed)
    chain = [n for n in graph.nodes if n.op == "call_function" and module_path(n) == path]
    chain = chain[: chain.index(normed) + 1]
    weights = [a for n in chain for a in n.all_input_nodes if a.op == "get_attr"]
    if len(weights) != 1:
        raise SpeccError(f"expected one weight in the norm {path}, found {len(weights)}")
    register_parameter(gm, weight, attribute(gm, weights[0].target).detach())
    env = {source: replacement}
    with graph.inserting_before(normed.next):
        env[weights[0]] = graph.get_attr(weight)
        for node in chain:
            copy = graph.node_copy(node, lambda n: env.get(n, n))
            env[node] = copy
    return env[normed]


def _widen(gm: fx.GraphModule, projections: list[fx.Node]) -> list[str]:
    """Each projection's weight `[out, hidden]` becomes `[W/2 | W/2]`, reading `[embed, feature]`."""
    widened = []
    for projection in projections:
        name = projection.args[1].target
        weight = attribute(gm, name).detach()
        register_parameter(gm, name, torch.cat([weight / 2, weight / 2], dim=1))
        widened.append(name)
    return widened


def _expose_hidden(graph: fx.Graph, block_output: fx.Node) -> None:
    append_outputs(graph, [block_output], [TensorSpec(HIDDEN_OUTPUT, EXIT_ROLE, "float", (1, "q", "hidden"))])
