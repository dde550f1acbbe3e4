"""Run consecutive decoder layers of one shape as one call of specc's CPU kernel.

After `fuse_decoder_chain` a decoder step under specc's blocked kernels is one
`torch.ops.specc.decoder_layer` call a layer (its row attention, the chain to the next
layer's q/k/v, the rotary embedding and the cache writes). Each call costs the step
20-27 us outside its kernel on a small model (the shim's checks and allocations and the
package's handles, run from a cache the layer's weights have just streamed through), while
the other threads wait: ~0.7 ms of a SmolLM2 step. This pass puts one
`torch.ops.specc.decoder_stack` in place of each run of such calls where each layer takes the
query and residual the one before returned (and nothing else uses them), attends over the
caches the one before wrote, and all share the mask, the rotary tables, the positions and
their shapes (`specc/kernels/decoder_chain.py`). The stack computes what the calls did, bit
for bit. A layer whose residual something else reads (a method's exit) ends a run.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from specc.graph.nodes import calls, graph_modules, value_users
from specc.graph.tidy import tidy
from specc.kernels import decoder_chain  # noqa: F401  (register torch.ops.specc.*)
from specc.kernels.decoder_chain import named_operands
from specc.passes.base import GraphPass, PassResult
from specc.passes.fuse_decoder_chain import DECODER_LAYER

aten = torch.ops.aten
DECODER_STACK = torch.ops.specc.decoder_stack.default
SHARED = ("mask", "scale", "intermediate", "next_features", "packed_threads", "eps", "cos", "sin", "cache_positions",
          "heads")
BITS = ("o_bits", "gate_up_bits", "down_bits", "next_bits")


class StackDecoderLayers(GraphPass):
    name = "stack_decoder_layers"

    def run(self, gm: fx.GraphModule) -> PassResult:
        inserted, replaced = [], []
        for module in graph_modules(gm):
            runs = _runs(module.graph)
            for layers in runs:
                replaced += [layer.node.name for layer in layers]
                inserted.append(_stack(module.graph, layers).name)
            if runs:
                tidy(module)
        if not replaced:
            return PassResult.unchanged(gm)
        return PassResult(gm, True, inserted=inserted, replaced=replaced)


class Layer:
    """A decoder_layer call with its operands by name and the nodes that hand its outputs on."""

    def __init__(self, node: fx.Node):
        self.node = node
        self.operands = named_operands(DECODER_LAYER, node.args)
        outputs = {user.args[1]: user for user in node.users if calls(user, operator.getitem)}
        self.residual_rows, self.query_rows = outputs.get(0), outputs.get(1)
        self.complete = len(outputs) == len(node.users) == 2

    def __getitem__(self, name: str):
        return self.operands[name]


def _runs(graph: fx.Graph) -> list[list[Layer]]:
    """Runs of two layers or more, each layer following the one before."""
    runs, current = [], []
    for node in graph.nodes:
        if not calls(node, DECODER_LAYER):
            continue
        layer = Layer(node)
        if current and _follows(current[-1], layer, current[0]):
            current.append(layer)
            continue
        if len(current) >= 2:
            runs.append(current)
        current = [layer] if _opens(layer) else []
    if len(current) >= 2:
        runs.append(current)
    return runs


def _opens(layer: Layer) -> bool:
    """Whether `layer` can be a stack's first: whole caches sliced from their start for keys and values."""
    return layer.complete and len(layer.node.args) in (23, 24) and not layer.node.kwargs \
        and _prefix(layer["key"]) is not None and _prefix(layer["value"]) is not None \
        and _shaped_source(layer["residual"]) is not None


def _follows(previous: Layer, layer: Layer, first: Layer) -> bool:
    """Whether `layer` takes `previous`'s query, residual and written caches, alone, and shares the
    first layer's other operands."""
    if not (_opens(layer) and previous.complete) or any(not _same(layer[name], first[name]) for name in SHARED):
        return False
    if (layer.operands.get("next_bias") is None) != (first.operands.get("next_bias") is None):
        return False
    key, value = _prefix(layer["key"]), _prefix(layer["value"])
    if key[0] is not previous["k_cache"] or value[0] is not previous["v_cache"] \
            or not _same(key[1], _prefix(first["key"])[1]) or not _same(value[1], _prefix(first["value"])[1]):
        return False
    return _query_of(layer) is previous.query_rows and _residual_of(layer) is previous.residual_rows


def _prefix(node) -> tuple[fx.Node, object] | None:
    """(cache, length) of `cache[:, :, :length]` (export's slice of axis 2 from 0), else None."""
    if calls(node, aten.slice.Tensor) and len(node.args) == 4 and node.args[1:3] == (2, 0) \
            and isinstance(node.args[0], fx.Node) and len(node.users) == 1:
        return node.args[0], node.args[3]
    return None


def _query_of(layer: Layer) -> fx.Node | None:
    """The rows r of `layer`'s query `transpose(view(r, [1, s, -1, dim]), 1, 2)`, each step used there alone."""
    transposed = layer["query"]
    if not (calls(transposed, aten.transpose.int) and tuple(transposed.args[1:]) == (1, 2)
            and len(transposed.users) == 1):
        return None
    viewed = transposed.args[0]
    if not (calls(viewed, aten.view.default) and len(viewed.users) == 1):
        return None
    rows = viewed.args[0]
    return rows if isinstance(rows, fx.Node) and len(rows.users) == 1 else None


def _residual_of(layer: Layer) -> fx.Node | None:
    """The rows r of `layer`'s residual `reshape(reshape(r, shape), [-1, hidden])`, the outer reshape
    used there alone and the inner by it (and by reads of its sizes)."""
    flat = layer["residual"]
    if not (calls(flat, aten.reshape.default) and len(flat.users) == 1):
        return None
    shaped = flat.args[0]
    if not (calls(shaped, aten.reshape.default) and value_users(shaped) == {flat}):
        return None
    rows = shaped.args[0]
    return rows if isinstance(rows, fx.Node) and set(rows.users) == {shaped} else None


def _stack(graph: fx.Graph, layers: list[Layer]) -> fx.Node:
    """The stack in place of `layers`, before the last; their outputs' users moved onto its."""
    first, last = layers[0], layers[-1]
    first_key, first_value = _prefix(first["key"]), _prefix(first["value"])
    shared = {name: first[name] for name in SHARED}
    biases = [layer["next_bias"] for layer in layers] if first.operands.get("next_bias") is not None else []
    _resize_from(graph, layers)
    with graph.inserting_before(last.node):
        stack = graph.call_function(DECODER_STACK, (
            first["query"], shared["mask"], shared["scale"], first["residual"],
            [layer["weights"] for layer in layers], [layer["post_norm"] for layer in layers],
            [layer["next_norm"] for layer in layers], [layer[name] for layer in layers for name in BITS],
            shared["intermediate"], shared["next_features"], shared["packed_threads"], shared["eps"],
            shared["cos"], shared["sin"], shared["cache_positions"], first_key[1],
            [first_key[0], *(layer["k_cache"] for layer in layers)],
            [first_value[0], *(layer["v_cache"] for layer in layers)], shared["heads"], biases))
        residual_rows = graph.call_function(operator.getitem, (stack, 0))
        query_rows = graph.call_function(operator.getitem, (stack, 1))
    for node in (stack, residual_rows, query_rows):
        node.meta["nn_module_stack"] = last.node.meta.get("nn_module_stack", [])
    last.residual_rows.replace_all_uses_with(residual_rows)
    last.query_rows.replace_all_uses_with(query_rows)
    _erase_unused(graph, _handed_on(layers))
    return stack


def _resize_from(graph: fx.Graph, layers: list[Layer]) -> None:
    """Reads of the sizes of a residual the stack hands on inside itself, read instead from the
    stack's own residual's source (the same shape): later reshapes take their sizes from them."""
    source = _shaped_source(layers[0]["residual"])
    for layer in layers[1:]:
        shaped = layer["residual"].args[0]
        for size in [user for user in shaped.users if calls(user, aten.sym_size.int)]:
            with graph.inserting_after(source):
                again = graph.call_function(aten.sym_size.int, (source, *size.args[1:]))
            size.replace_all_uses_with(again)


def _shaped_source(flat: fx.Node) -> fx.Node | None:
    """x of the first layer's residual `reshape(x, [-1, hidden])`."""
    return flat.args[0] if calls(flat, aten.reshape.default) and isinstance(flat.args[0], fx.Node) else None


def _handed_on(layers: list[Layer]) -> set[fx.Node]:
    """The layers' calls and the nodes between them that only the stack's inside now needs."""
    nodes = set()
    for index, layer in enumerate(layers):
        nodes |= {layer.node, layer.residual_rows, layer.query_rows, layer["key"], layer["value"]}
        if index:
            transposed = layer["query"]
            nodes |= {transposed, transposed.args[0], layer["residual"], layer["residual"].args[0]}
            nodes |= {user for user in layer["residual"].args[0].users if calls(user, aten.sym_size.int)}
    return nodes


def _erase_unused(graph: fx.Graph, nodes: set[fx.Node]) -> None:
    """Erase `nodes`, last first, as each is left without users (the layer calls mutate their caches,
    so dead-code elimination would keep them)."""
    erased = set()
    for node in reversed(list(graph.nodes)):
        if node in nodes and not node.users:
            graph.erase_node(node)
            erased.add(node)
    left = [node.name for node in nodes - erased]
    if left:
        raise AssertionError(f"stack_decoder_layers: {left} still used after stacking their layers")


def _same(a, b) -> bool:
    """The same node, the same constant, or the same read of one tensor's size."""
    if a is b or (not isinstance(a, fx.Node) and not isinstance(b, fx.Node) and a == b):
        return True
    return calls(a, aten.sym_size.int) and calls(b, aten.sym_size.int) and a.args == b.args
