"""Capture an unmodified Hugging Face causal LM with torch.export.

The result is a flat FX GraphModule `input_ids -> logits` with the
sequence length dynamic, every parameter a `get_attr`, and the
`nn_module_stack` metadata the passes use to find layers. Higher-order
wrappers that only toggle grad/autocast modes are inlined so every later
pass sees one flat graph.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import sympy
import torch
import torch.fx as fx
from torch.fx.graph import CodeGen

from specc.capture.families import ArchitectureSummary, layer_windows, summarize_architecture
from specc.errors import SpeccError
from specc.graph.nodes import ATTENTION_WINDOW, attention_nodes, attribute, layer_index
from specc.graph.signature import TensorSpec, declare_input, declare_outputs
from specc.graph.tidy import remove_assertions, tidy

_MODE_WRAPPERS = {"wrap_with_set_grad_enabled": 1, "wrap_with_autocast": 4}


@dataclass
class CapturedProgram:
    graph_module: fx.GraphModule
    architecture: ArchitectureSummary


def capture(model: torch.nn.Module, max_seq_len: int) -> CapturedProgram:
    architecture = summarize_architecture(model.config, getattr(model, "generation_config", None))
    model.config.use_cache = False
    exported = _export(model, max_seq_len)
    gm = exported.module()
    gm.graph._codegen = CodeGen()
    gm = fx.GraphModule(gm, gm.graph)
    remove_assertions(gm)
    inline_mode_wrappers(gm)
    _declare_signature(gm)
    _tag_sliding_layers(gm, layer_windows(model.config))
    return CapturedProgram(tidy(gm), architecture)


def _tag_sliding_layers(gm: fx.GraphModule, windows: tuple[int | None, ...] | None) -> None:
    """Mark each attention call of a sliding layer with its window, where layers mix attention kinds
    (`specc.passes.window_sliding_layers` windows those calls' masks)."""
    if windows is None:
        return
    for sdpa in attention_nodes(gm.graph):
        layer = layer_index(sdpa)
        if layer is None or layer >= len(windows):
            raise SpeccError(f"attention node {sdpa.name} has no decoder layer among the {len(windows)} the config's "
                             f"layer_types describe")
        if windows[layer] is not None:
            sdpa.meta[ATTENTION_WINDOW] = windows[layer]


def _declare_signature(gm: fx.GraphModule) -> None:
    """The captured graph maps `input_ids [1, q]` to `logits [1, q, vocab]`."""
    (tokens,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    declare_input(tokens, "tokens", "int64", (1, "q"))
    declare_outputs(gm.graph, [TensorSpec("logits", "logits", "float", (1, "q", "vocab"))])


def _export(model: torch.nn.Module, max_seq_len: int):
    example = torch.zeros(1, min(8, max_seq_len), dtype=torch.long)
    seq = torch.export.Dim("seq", min=1, max=max_seq_len)
    try:
        with torch.no_grad():
            exported = torch.export.export(
                model, args=(), kwargs={"input_ids": example},
                dynamic_shapes={"input_ids": {1: seq}}, strict=False,
                prefer_deferred_runtime_asserts_over_guards=True,
            )
    except Exception as exc:
        raise SpeccError(
            f"torch.export failed for {type(model).__name__}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from exc
    _check_runtime_asserts(exported, type(model).__name__, max_seq_len)
    return exported


def _check_runtime_asserts(exported, model_name: str, max_seq_len: int) -> None:
    """Every shape assertion export deferred to run time holds for every length up to `max_seq_len`.

    Deferring is for what torch cannot simplify: torch 2.11 leaves the stride
    `prims.collapse_view` gives GQA's repeat_kv reshape as Min(16*s, 32*s), so it
    asserts Eq(Min(16*s, 32*s), 16*s), true for every s, which as a guard would fail
    the strict `seq` Dim. `remove_assertions` drops these nodes, so an assertion that
    does restrict the length (which the strict Dim used to reject) is rejected here.
    """
    assumed = set()
    for node in exported.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten._assert_scalar.default:
            condition = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else node.args[0]
            assumed.add(condition.node.expr if isinstance(condition, torch.SymBool) else sympy.sympify(bool(condition)))
    for expr in assumed:
        if len(expr.free_symbols) > 1:
            raise SpeccError(f"torch.export failed for {model_name}: it assumes {expr}")
        for length in range(1, max_seq_len + 1):
            if not bool(expr.xreplace({s: sympy.Integer(length) for s in expr.free_symbols})):
                raise SpeccError(f"torch.export failed for {model_name}: it assumes {expr}, "
                                 f"false for a sequence of {length} tokens")


def inline_mode_wrappers(gm: fx.GraphModule) -> int:
    """Replace grad/autocast higher-order wrappers by the ops they wrap.

    Inference runs under no_grad and the wrapped code already casts
    explicitly, so the wrappers carry no meaning the runtime needs.
    """
    inlined = 0
    for node in list(gm.graph.nodes):
        body_index = _mode_wrapper_body_index(node)
        if body_index is None:
            continue
        body = getattr(gm, node.args[body_index].target)
        results = _copy_body(gm, node, body, node.args[body_index + 1:])
        for user in list(node.users):
            if user.target is operator.getitem:
                user.replace_all_uses_with(results[user.args[1]])
                gm.graph.erase_node(user)
        if not node.users:
            gm.graph.erase_node(node)
        inlined += 1
    return inlined


def _mode_wrapper_body_index(node: fx.Node) -> int | None:
    if node.op != "call_function":
        return None
    return _MODE_WRAPPERS.get(getattr(node.target, "__name__", ""))


def _copy_body(gm: fx.GraphModule, call: fx.Node, body: fx.GraphModule, operands) -> list:
    env: dict[fx.Node, object] = {}
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, operands))
    results: list = []
    with gm.graph.inserting_before(call):
        for inner in body.graph.nodes:
            if inner.op == "placeholder":
                continue
            if inner.op == "output":
                out = inner.args[0]
                results = [env[o] if isinstance(o, fx.Node) else o for o in (out if isinstance(out, (tuple, list)) else [out])]
                continue
            if inner.op == "get_attr":
                env[inner] = _hoist_attribute(gm, body, inner)
                continue
            copied = gm.graph.node_copy(inner, lambda n: env[n])
            copied.meta.setdefault("nn_module_stack", call.meta.get("nn_module_stack", {}))
            env[inner] = copied
    return results


def _hoist_attribute(gm: fx.GraphModule, body: fx.GraphModule, node: fx.Node) -> fx.Node:
    name = f"_inlined_{str(node.target).replace('.', '_')}"
    value = attribute(body, node.target)
    if not hasattr(gm, name):
        gm.register_buffer(name, value)
    return gm.graph.get_attr(name)
