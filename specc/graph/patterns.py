"""Graph patterns several passes share: where a layer's output, attention and residual adds
are, the LM head, cached attention, parameters added to a graph, unreachable nodes.

Passes find what they rewrite through these, never through another pass's privates.
"""

from __future__ import annotations

import operator
import re

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import attention_nodes, layer_index, module_path, output_node
from specc.graph.signature import CACHE_ROLE, OUTPUTS_META, declare_input

aten = torch.ops.aten


def layer_output(graph: fx.Graph, layer: int) -> fx.Node:
    """The residual stream leaving decoder layer `layer`: the one node of that
    layer read by compute outside it (the next layer, or the final norm).
    Cache writes carry no module metadata and do not count."""
    outputs = [
        n for n in graph.nodes
        if layer_index(n) == layer and any(_outside_layer(u, layer) for u in n.users)
    ]
    if len(outputs) != 1:
        raise SpeccError(
            f"expected one hidden state leaving decoder layer {layer}, found "
            f"{[n.name for n in outputs] or 'none'}; is this a decoder graph captured by specc?"
        )
    return outputs[0]


def remove_unreachable(graph: fx.Graph) -> list[str]:
    """Erase every node the output does not depend on, side effects included.

    Plain dead-code elimination keeps in-place cache writes; a layer that was
    cut away must not keep writing its cache, so reachability decides.
    Inputs stay: the graph's calling convention does not change.
    """
    live: set[fx.Node] = set()
    pending = [output_node(graph)]
    while pending:
        node = pending.pop()
        if node not in live:
            live.add(node)
            pending.extend(node.all_input_nodes)
    removed = []
    for node in reversed(list(graph.nodes)):
        if node not in live and node.op != "placeholder":
            removed.append(node.name)
            graph.erase_node(node)
    return removed[::-1]


def declare_cache_input(node: fx.Node) -> fx.Node:
    """A preallocated cache `[1, kv_heads, slots, head_dim]`, written in place."""
    return declare_input(node, CACHE_ROLE, "float", (1, "kv_heads", "slots", "head_dim"))


def is_cached_attention(sdpa: fx.Node) -> bool:
    key = sdpa.args[1]
    return (isinstance(key, fx.Node) and key.target == aten.slice.Tensor
            and isinstance(key.args[0], fx.Node) and key.args[0].target == aten.index_put_.default)


def register_parameter(gm: fx.GraphModule, dotted: str, value: torch.Tensor) -> None:
    """A frozen parameter of the graph under `dotted`, its parent modules created as needed."""
    owner, _, leaf = dotted.rpartition(".")
    if owner not in dict(gm.named_modules()):
        gm.add_submodule(owner, torch.nn.Module())
    gm.get_submodule(owner).register_parameter(leaf, torch.nn.Parameter(value.clone(), requires_grad=False))


LAYER_PATH = re.compile(r"^(.*?\blayers\.\d+)(?:\.|$)")


def adopt_parameters(gm: fx.GraphModule, renames: dict[str, str]) -> list[str]:
    """Give a head cut from the target copies of the parameters it reads, under its own names."""
    added = []
    for node in list(gm.graph.nodes):
        new_name = renamed(node.target, renames) if node.op == "get_attr" else None
        if new_name is None:
            continue
        value = operator.attrgetter(node.target)(gm)
        _set_parameter(gm, new_name, torch.nn.Parameter(value.detach().clone(), requires_grad=False))
        with gm.graph.inserting_before(node):
            adopted = gm.graph.get_attr(new_name)
        adopted.meta = dict(node.meta)
        node.replace_all_uses_with(adopted)
        gm.graph.erase_node(node)
        added.append(new_name)
    return added


def attention_of(graph: fx.Graph, layer: int) -> fx.Node:
    calls = [n for n in attention_nodes(graph) if layer_index(n) == layer]
    if len(calls) != 1:
        raise SpeccError(f"expected one attention call in decoder layer {layer}, found {len(calls)}")
    return calls[0]


def final_norm_path(residual: fx.Node) -> str:
    paths = {module_path(u) for u in residual.users if layer_index(u) is None and module_path(u)}
    if len(paths) != 1:
        raise SpeccError(f"expected the final norm to read the adapter output, found readers in {sorted(paths)}")
    return paths.pop()


PASS_THROUGH = {aten.alias.default, aten.to.dtype, aten._to_copy.default, aten.view.default, aten.reshape.default}


def lm_head(graph: fx.Graph) -> fx.Node:
    """The `linear` producing the output declared with role `logits`."""
    output = output_node(graph)
    specs = output.meta.get(OUTPUTS_META, [])
    roles = [spec["role"] for spec in specs]
    if "logits" not in roles:
        raise SpeccError("the graph declares no logits output; nothing to reduce")
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    node = values[roles.index("logits")]
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in PASS_THROUGH:
        node = node.args[0]
    if not (isinstance(node, fx.Node) and node.target == aten.linear.default
            and isinstance(node.args[1], fx.Node) and node.args[1].op == "get_attr"):
        raise SpeccError(f"expected the logits to come from a linear LM head, found {getattr(node, 'target', node)}")
    return node


def token_embedding(graph: fx.Graph) -> fx.Node:
    """The `embedding` lookup of the graph's first input, the tokens."""
    tokens = next(n for n in graph.nodes if n.op == "placeholder")
    found = [n for n in tokens.users if n.op == "call_function" and n.target == aten.embedding.default]
    if len(found) != 1:
        raise SpeccError(f"expected one token embedding reading {tokens.name}, found {len(found)}")
    return found[0]


def partition_order(partition: dict[fx.Node, str]) -> dict[str, int]:
    order: dict[str, int] = {}
    for name in partition.values():
        order.setdefault(name, len(order))
    return order


def rename_submodules(split: fx.GraphModule, names: dict[str, str]) -> None:
    for node in split.graph.nodes:
        if node.op == "call_module" and node.target in names:
            new = names[node.target]
            split.add_submodule(new, getattr(split, node.target))
            delattr(split, node.target)
            node.target = new


def layer_path(node: fx.Node) -> str:
    path = module_path(node)
    marker = f"layers.{layer_index(node)}"
    return path[: path.index(marker) + len(marker)]


def is_residual_add(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target == torch.ops.aten.add.Tensor
            and module_path(node) == layer_path(node)
            and all(isinstance(a, fx.Node) for a in node.args[:2]))


def _outside_layer(node: fx.Node, layer: int) -> bool:
    return node.op == "call_function" and layer_index(node) != layer and module_path(node) != ""


def renamed(name: str, renames: dict[str, str]) -> str | None:
    for old, new in renames.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


def _set_parameter(gm: fx.GraphModule, dotted: str, value: torch.nn.Parameter) -> None:
    owner, _, leaf = dotted.rpartition(".")
    if owner not in dict(gm.named_modules()):
        gm.add_submodule(owner, torch.nn.Module())   # installs any missing parents too
    gm.get_submodule(owner).register_parameter(leaf, value)
