"""Rewrite the target's linear layers to quantized matmuls (`specc compile --quantize`).

Each `aten.linear` whose weight is a frozen target tensor becomes

    rows = reshape(x, [-1, in]);  y = <the scheme's matmul>(rows, packed…);  y = reshape(y, [..., out]) (+ bias)

with the packed tensors (`specc.quantize.schemes`) as buffers beside the weight they
replace, which is dropped once no node reads it. Tensors are packed once per program:
graphs over the same weight share one packed copy (`store`), so an engine stores it once.
The weight computing the logits takes 8 bits under 4-bit schemes (`schemes.scheme_for`).
Weights a method added (heads, adapters) keep their dtype: training fills them after the
passes run. Runs on engine graphs after `select_logit_rows`, so the LM head it quantizes
already computes only the rows asked for.

Under the blocked schemes (`q4`, `q6`, `q8`), linears reading one input (q/k/v, gate/up) become
one matmul over their stacked weights and a slice per linear: each output is the bits its
own call would give, and the input is quantized, and the threads started, once.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx

from specc.graph.nodes import FROZEN_COPIES, attribute, is_linear, stacked_name
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes
from specc.quantize.schemes import BLOCKED, Scheme, scheme_for

aten = torch.ops.aten

WeightKey = tuple[int, tuple[int, ...], torch.dtype]


class QuantizeLinearWeights(GraphPass):
    name = "quantize_linear_weights"

    def __init__(self, scheme: Scheme, quantizable: Callable[[torch.Tensor], bool] | None = None,
                 store: dict[WeightKey, tuple[Scheme, dict]] | None = None,
                 computes_logits: Callable[[torch.Tensor], bool] | None = None):
        self.scheme = scheme
        self.quantizable = quantizable or (lambda tensor: True)
        self.store = {} if store is None else store
        self.computes_logits = computes_logits or (lambda tensor: False)

    def describe(self) -> dict:
        return self.scheme.to_json()

    def run(self, gm: fx.GraphModule) -> PassResult:
        modules = _graph_modules(gm)
        before = {prefix: set(module.graph.nodes) for prefix, module in modules.items()}
        replaced, added = [], []
        for prefix, module in modules.items():
            for group in self._sibling_groups(module):
                replaced += [prefix + linear.name for linear in group]
                added += self._quantize_siblings(module, group, prefix)
            for linear in [n for n in module.graph.nodes if self._reads_attribute(module, n)]:
                replaced.append(prefix + linear.name)
                added += self._quantize_attribute(module, linear, prefix)
        for call in [n for n in gm.graph.nodes if n.op == "call_module" and f"{n.target}." in modules]:
            done, added_here = self._quantize_segment_inputs(gm, call, modules[f"{call.target}."])
            replaced += [f"{call.target}.{name}" for name in done]
            added += added_here
        if not replaced:
            return PassResult.unchanged(gm)
        for module in modules.values():
            tidy(module)
        inserted = [prefix + name for prefix, module in modules.items()
                    for name in new_nodes(before[prefix], module)]
        return PassResult(gm, True, inserted=inserted, replaced=replaced, added_parameters=added)

    def _quantizes(self, tensor: torch.Tensor, frozen_copy: bool = False) -> bool:
        return tensor.dim() == 2 and tensor.is_floating_point() and (frozen_copy or self.quantizable(tensor))

    def _reads_attribute(self, module: fx.GraphModule, node: fx.Node) -> bool:
        """A linear whose weight is a get_attr of a tensor this pass quantizes, or of a frozen
        copy an earlier pass made of one (`FROZEN_COPIES`: a reduced draft head)."""
        weight = node.args[1] if is_linear(node) else None
        if not (isinstance(weight, fx.Node) and weight.op == "get_attr"):
            return False
        return self._quantizes(attribute(module, weight.target),
                               frozen_copy=weight.target in module.meta.get(FROZEN_COPIES, ()))

    def _packed(self, tensor: torch.Tensor) -> tuple[Scheme, dict]:
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key not in self.store:
            scheme = scheme_for(self.scheme, tensor, logits=self.computes_logits(tensor))
            self.store[key] = scheme, scheme.pack(tensor)
        return self.store[key]

    def _quantize_attribute(self, module: fx.GraphModule, linear: fx.Node, prefix: str) -> list[str]:
        """`linear` reading its weight through get_attr: the packed tensors read the same way."""
        weight = linear.args[1]
        tensor = attribute(module, weight.target)
        scheme, packed = self._packed(tensor)
        names = _register(module, weight.target, packed)
        with module.graph.inserting_before(linear):
            nodes = {key: module.graph.get_attr(name) for key, name in names.items()}
        _replace_linear(module.graph, linear, scheme, nodes, tensor.shape)
        return [prefix + name for name in names.values()]

    def _sibling_groups(self, module: fx.GraphModule) -> list[list[fx.Node]]:
        """Linears reading one input (q/k/v, gate/up) whose weights all take a blocked scheme:
        one call over their stacked tiles computes each output as its own call would, bit for
        bit (every output feature is summed alone), and reads the input and starts threads once."""
        if self.scheme.kernel != BLOCKED:
            return []
        by_input: dict[fx.Node, list[fx.Node]] = {}
        for node in module.graph.nodes:
            if self._reads_attribute(module, node) and isinstance(node.args[0], fx.Node):
                by_input.setdefault(node.args[0], []).append(node)
        groups = []
        for linears in by_input.values():
            tensors = [attribute(module, linear.args[1].target) for linear in linears]
            schemes = {scheme_for(self.scheme, t, logits=self.computes_logits(t)) for t in tensors}
            if len(linears) > 1 and schemes == {self.scheme} and len({t.shape[1] for t in tensors}) == 1:
                groups.append(linears)
        return groups

    def _quantize_siblings(self, module: fx.GraphModule, group: list[fx.Node], prefix: str) -> list[str]:
        targets = [linear.args[1].target for linear in group]
        tensors = [attribute(module, target) for target in targets]
        key = tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in tensors)
        if key not in self.store:
            parts = [self._packed(t)[1] for t in tensors]
            self.store[key] = self.scheme, {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
        _, packed = self.store[key]
        names = _register(module, stacked_name(targets), packed)
        with module.graph.inserting_before(group[0]):
            nodes = {k: module.graph.get_attr(name) for k, name in names.items()}
        _replace_siblings(module.graph, group, self.scheme, nodes, [t.shape for t in tensors])
        return [prefix + name for name in names.values()]

    def _quantize_segment_inputs(self, gm: fx.GraphModule, call: fx.Node,
                                 segment: fx.GraphModule) -> tuple[list[str], list[str]]:
        """A segment (`insert_skip_branches`, `segment_by_layer`) takes the parent's weights as
        inputs: a weight input only linears read becomes one input per packed tensor."""
        placeholders = [n for n in segment.graph.nodes if n.op == "placeholder"]
        if call.kwargs or len(call.args) != len(placeholders):
            return [], []
        args, replaced, added = [], [], []
        for arg, placeholder in zip(call.args, placeholders):
            if not self._weight_input(gm, arg, placeholder):
                args.append(arg)
                continue
            tensor = attribute(gm, arg.target)
            scheme, packed = self._packed(tensor)
            names = _register(gm, arg.target, packed)
            added += names.values()
            with gm.graph.inserting_before(call):
                args += [gm.graph.get_attr(name) for name in names.values()]
            inputs, anchor = {}, placeholder
            for key in names:
                with segment.graph.inserting_after(anchor):
                    inputs[key] = anchor = segment.graph.placeholder(f"{placeholder.name}_{key}")
            for linear in list(placeholder.users):
                replaced.append(linear.name)
                _replace_linear(segment.graph, linear, scheme, inputs, tensor.shape)
            segment.graph.erase_node(placeholder)
        call.args = tuple(args)
        return replaced, added

    def _weight_input(self, gm: fx.GraphModule, arg, placeholder: fx.Node) -> bool:
        return (isinstance(arg, fx.Node) and arg.op == "get_attr" and self._quantizes(attribute(gm, arg.target))
                and bool(placeholder.users)
                and all(is_linear(user) and user.args[1] is placeholder and user.args[0] is not placeholder
                        for user in placeholder.users))


def _register(module: fx.GraphModule, weight: str, packed: dict[str, torch.Tensor]) -> dict[str, str]:
    """The packed tensors as buffers beside `weight` (`…proj.weight_qweight`, …), by key."""
    owner_path, _, leaf = weight.rpartition(".")
    owner = module.get_submodule(owner_path)
    names = {}
    for key, value in packed.items():
        buffer = f"{leaf}_{key}"
        if not hasattr(owner, buffer):
            owner.register_buffer(buffer, value)
        names[key] = f"{owner_path}.{buffer}" if owner_path else buffer
    return names


def _replace_linear(graph: fx.Graph, linear: fx.Node, scheme: Scheme, packed: dict[str, fx.Node],
                    shape: torch.Size) -> None:
    """`linear` as reshape → quantized matmul → reshape (+ bias), with `linear`'s metadata."""
    out_features, in_features = shape
    call = graph.call_function
    with graph.inserting_before(linear):
        rows = call(aten.reshape.default, (linear.args[0], [-1, in_features]))
        op, args = scheme.call_args(rows, packed, out_features)
        result = call(op, args)
    _finish_linear(graph, linear, result, out_features, made=[rows, result])


def _finish_linear(graph: fx.Graph, linear: fx.Node, result: fx.Node, out_features: int,
                   made: list[fx.Node]) -> None:
    """`result` (`[rows, out]`) reshaped to `linear`'s leading dimensions, plus its bias, in its place."""
    x = linear.args[0]
    bias = linear.args[2] if len(linear.args) > 2 else None
    rank = linear.meta["val"].dim() if "val" in linear.meta else 3
    call = graph.call_function
    with graph.inserting_before(linear):
        if rank != 2:
            made += (leading := [call(aten.sym_size.int, (x, dim)) for dim in range(rank - 1)])
            made.append(result := call(aten.reshape.default, (result, [*leading, out_features])))
        if bias is not None:
            made.append(result := call(aten.add.Tensor, (result, bias)))
    for node in made:
        if "nn_module_stack" in linear.meta and "nn_module_stack" not in node.meta:
            node.meta["nn_module_stack"] = linear.meta["nn_module_stack"]
    result.meta.update({k: v for k, v in linear.meta.items() if k not in ("val", "tensor_meta")})
    linear.replace_all_uses_with(result)
    graph.erase_node(linear)


def _replace_siblings(graph: fx.Graph, group: list[fx.Node], scheme: Scheme, packed: dict[str, fx.Node],
                      shapes: list[torch.Size]) -> None:
    """One matmul over the stacked weights, then each linear's columns (+ its bias), reshaped back."""
    x, in_features, total = group[0].args[0], shapes[0][1], sum(shape[0] for shape in shapes)
    call = graph.call_function
    with graph.inserting_before(group[0]):
        rows = call(aten.reshape.default, (x, [-1, in_features]))
        op, args = scheme.call_args(rows, packed, total)
        stacked = call(op, args)
    start = 0
    for linear, shape in zip(group, shapes):
        with graph.inserting_before(linear):
            columns = call(aten.slice.Tensor, (stacked, 1, start, start + shape[0]))
        start += shape[0]
        _finish_linear(graph, linear, columns, shape[0], made=[rows, stacked, columns])


def _graph_modules(gm: fx.GraphModule) -> dict[str, fx.GraphModule]:
    """`gm` and the graph modules its graph calls (segments), by dotted prefix."""
    found = {"": gm}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            child = gm.get_submodule(node.target)
            if isinstance(child, fx.GraphModule):
                found[f"{node.target}."] = child
    return found
