"""Turn a graph that starts at a layer exit into Kangaroo's adapter draft head.

Input: a graph whose decoder layers read the `exit_hidden` input (the deep
side of `expose_layer_exit`). Output: exit → input RMSNorm → one attention
block with its residual (no MLP) → final RMSNorm → the target's LM head.
With `with_mlp`, the adapter keeps layer l's MLP too (a whole decoder layer,
as EAGLE's draft block): more capacity for a model whose shallow layers
predict poorly, at the cost of one MLP read per drafted token.

The adapter is the target's own first remaining layer (l) with its MLP
(unless `with_mlp`) and every later layer cut away, so its attention is
the family's attention as captured: same projections, rotary positions
from `position_ids`, the same `attn_mask` input and cached keys/values,
and no forked modeling code. It gets parameters of its own, under the
`adapter` module of the graph (initialised as copies of layer l's
parameters it keeps and of the final norm), and a KV cache of its own (inputs `k_cache_adapter`,
`v_cache_adapter`, placed before `exit_hidden`). The LM head stays the
target's, shared and frozen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import normalize_path, layer_index, module_path, placeholder
from specc.graph.patterns import (LAYER_PATH, adopt_parameters, attention_of, declare_cache_input, final_norm_path,
                                  layer_output, remove_unreachable, renamed)
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes

ADAPTER_ROLE = "adapter"
_TARGET_CACHE = re.compile(r"^[kv]_cache_\d+$")


@dataclass(frozen=True)
class AdapterHeadConfig:
    exit_input: str = "exit_hidden"
    module_name: str = "adapter"
    cache_names: tuple[str, str] = ("k_cache_adapter", "v_cache_adapter")
    with_mlp: bool = False

    def to_json(self) -> dict:
        return {"exit_input": self.exit_input, "module_name": self.module_name,
                "cache_names": list(self.cache_names), "with_mlp": self.with_mlp}


class AttachAdapterHead(GraphPass):
    name = "attach_adapter_head"

    def __init__(self, config: AdapterHeadConfig = AdapterHeadConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        exit_input = placeholder(graph, self.config.exit_input)
        if exit_input is None or placeholder(graph, self.config.cache_names[0]) is not None:
            return PassResult.unchanged(gm)
        before = set(graph.nodes)
        layer = min(i for i in map(layer_index, exit_input.users) if i is not None)
        sdpa = attention_of(graph, layer)
        layer_path = LAYER_PATH.match(module_path(sdpa)).group(1)
        if self.config.with_mlp:
            residual = layer_output(graph, layer)
        else:
            residual = _attention_residual(graph, sdpa, layer_path)
        last_output = layer_output(graph, max(i for i in map(layer_index, graph.nodes) if i is not None))
        if last_output is not residual:
            last_output.replace_all_uses_with(residual)
        remove_unreachable(graph)
        norm_path = final_norm_path(residual)
        renames = {layer_path: self.config.module_name, norm_path: f"{self.config.module_name}.norm"}
        added_parameters = adopt_parameters(gm, renames)
        added_inputs = own_cache(graph, sdpa, exit_input, self.config.cache_names)
        relabel(graph, renames)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=[last_output.name],
                          added_parameters=added_parameters, added_inputs=added_inputs)


def own_cache(graph: fx.Graph, sdpa: fx.Node, before_input: fx.Node, cache_names: tuple[str, str]) -> list[str]:
    """Point a head's cache writes at inputs of its own (placed before `before_input`); drop the target's."""
    old = [_cache_input(sdpa.args[1]), _cache_input(sdpa.args[2])]
    with graph.inserting_before(before_input):
        new = [declare_cache_input(graph.placeholder(name)) for name in cache_names]
    for before, after in zip(old, new):
        before.replace_all_uses_with(after)
    for node in list(graph.nodes):
        if node.op == "placeholder" and _TARGET_CACHE.match(str(node.target)) and not node.users:
            graph.erase_node(node)
    return list(cache_names)


def _attention_residual(graph: fx.Graph, sdpa: fx.Node, layer_path: str) -> fx.Node:
    """The decoder layer's `residual + attention` add: its first own op after the attention."""
    nodes = list(graph.nodes)
    for node in nodes[nodes.index(sdpa) + 1:]:
        if module_path(node) == layer_path:
            if node.target is not torch.ops.aten.add.Tensor:
                raise SpeccError(f"expected the attention residual add in {layer_path}, found {node.target}")
            return node
    raise SpeccError(f"no residual add after the attention of {layer_path}")


def _cache_input(read: fx.Node) -> fx.Node:
    """`slice(index_put_(cache, ...))` → the cache input (see insert_kv_cache)."""
    cache = read.args[0].args[0]
    if cache.op != "placeholder":
        raise SpeccError(f"attention reads {read.name}, not a cache input; run insert_kv_cache first")
    return cache


def relabel(graph: fx.Graph, renames: dict[str, str]) -> None:
    """Module metadata names the adapter, not the target layer it was cut from,
    so nothing mistakes its nodes for decoder layer l (e.g. segment_by_layer)."""
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        paths = [(key, renamed(normalize_path(path), renames), kind) for key, (path, kind) in stack.items()]
        if not any(new for _, new, _ in paths):
            continue
        node.meta["nn_module_stack"] = {key: (new, kind) for key, new, kind in paths if new is not None}
        node.meta["specc_role"] = ADAPTER_ROLE


