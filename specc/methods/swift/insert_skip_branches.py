"""Give every attention and MLP sublayer a skip branch (SWIFT-style self-drafting).

The graph is split into segments, submodules the parent graph calls in
order: `prologue` (embedding, rotary tables and the protected leading
layers), then for each skippable decoder layer `attn_{i}` (input norm,
attention with its KV-cache write, residual add) and `mlp_{i}`
(post-attention norm, MLP, residual add), then `epilogue` (the protected
trailing layers, final norm, LM head). Boundaries come from metadata only:
each node's `nn_module_stack` (`model.layers.3.self_attn`, `….mlp`) and the
decoder layer's own residual `add` nodes, so no modeling code is forked.

Contract of a skip branch: the parent's `call_module` node of a skippable
segment carries `meta["specc_role"] == "skip_branch"`; the segment takes
the residual stream as its first input and returns the updated stream as
its only output. Skipping it means its output is its first input. A
skipped attention segment is not called at all, so it writes no KV.

Why segments and not a branch inside the graph: the skip set must change
at run time with no recompilation and no copy of the KV cache. `torch.cond`
branches may not mutate their inputs (the attention's cache write does),
and a data-dependent select would compute both sides. Calling only the
non-skipped segments (the drafter's job, at run time) does neither: the
compiled segments stay the same whatever the skip set, and they write into
the one shared cache. Running the parent graph calls every segment, which
is exactly the unsegmented model (Inductor and export inline the segments).

Layers `0 .. protected_first-1` and the last `protected_last` layers get no
skip branch (SWIFT never skips the first and last layer); they ride in the
prologue and epilogue, so the drafter makes fewer calls. A graph without
decoder layers, or one already segmented, is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx
from torch.fx.passes.split_module import split_module

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import SDPA, calls_submodules, layer_index, module_path
from specc.graph.patterns import is_residual_add, layer_path, partition_order, rename_submodules
from specc.passes.base import GraphPass, PassResult

SKIP_BRANCH_ROLE = "skip_branch"
_SEGMENT_PREFIXES = ("prologue", "epilogue", "attn_", "mlp_", "layer_")


@dataclass(frozen=True)
class SkipBranchesConfig:
    protected_first: int = 1   # leading layers without a skip branch
    protected_last: int = 1    # trailing layers without a skip branch
    mlp_module_name: str = "mlp"

    def __post_init__(self):
        if self.protected_first < 1:
            raise UsageError(f"protected_first={self.protected_first} must be at least 1: layer 0's attention "
                             f"reads the embedding, which the prologue returns among other values")
        if self.protected_last < 0:
            raise UsageError(f"protected_last={self.protected_last} must be 0 or more")

    def to_json(self) -> dict:
        return {"protected_first": self.protected_first, "protected_last": self.protected_last,
                "mlp_module_name": self.mlp_module_name}


class InsertSkipBranches(GraphPass):
    name = "insert_skip_branches"

    def __init__(self, config: SkipBranchesConfig = SkipBranchesConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        if calls_submodules(gm, _SEGMENT_PREFIXES):
            return PassResult.unchanged(gm)
        layout = _find_sublayers(gm.graph, self.config)
        if layout is None:
            return PassResult.unchanged(gm)
        partition, streams = layout
        order = partition_order(partition)
        split = split_module(gm, gm, lambda node: order[partition[node]], keep_original_order=True)
        rename_submodules(split, {f"submod_{i}": name for name, i in order.items()})
        _mark_skip_branches(split, streams)
        split.graph.lint()
        split.recompile()
        return PassResult(split, True, inserted=sorted(order, key=order.__getitem__))


def skip_branches(gm: fx.GraphModule) -> list[str]:
    """Names of the skippable segments, in call order."""
    return [n.target for n in gm.graph.nodes if n.op == "call_module" and n.meta.get("specc_role") == SKIP_BRANCH_ROLE]


def _find_sublayers(graph: fx.Graph, config: SkipBranchesConfig) -> tuple[dict[fx.Node, str], dict[str, str]] | None:
    """Assign every compute node to a segment; None when the graph has no decoder layers.

    Walking the graph in order, a layer's nodes open its attention sublayer;
    its first residual add (a tensor `add` owned by the decoder layer module
    itself, after the layer's attention) closes it and opens the MLP
    sublayer; the second closes that. Glue without metadata (cache writes,
    size queries) stays with the sublayer in progress. Protected layers go
    to the prologue (leading) or epilogue (trailing) segment whole.

    Also returns, for each skippable segment, the name of the node carrying
    the residual stream into it: the residual add that closed the sublayer
    before it.
    """
    layers = sorted({i for n in graph.nodes if (i := layer_index(n)) is not None})
    if not layers:
        return None
    first_skippable, end_skippable = config.protected_first, len(layers) - config.protected_last
    partition: dict[fx.Node, str] = {}
    closes: list[fx.Node] = []            # residual adds, in order: attn_0, mlp_0, attn_1, …
    stage: dict[int, int] = {}            # per layer: 0 in attention, 1 in MLP, 2 done
    seen = {"attn": set(), "mlp": set()}
    current = "prologue"
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        layer = layer_index(node)
        if layer is not None:
            kind = ("attn", "mlp", None)[stage.setdefault(layer, 0)]
            if kind is None:
                raise SpeccError(f"node {node.name} of decoder layer {layer} comes after the layer's MLP "
                                 f"residual add; insert_skip_branches expects a pre-norm attention → MLP layer")
            current = ("prologue" if layer < first_skippable else
                       "epilogue" if layer >= end_skippable else f"{kind}_{layer}")
            if node.op == "call_function" and node.target == SDPA:
                seen["attn"].add(layer)
            if module_path(node).startswith(f"{layer_path(node)}.{config.mlp_module_name}"):
                seen["mlp"].add(layer)
        partition[node] = current
        if layer is not None and is_residual_add(node) and layer in seen[kind]:
            stage[layer] += 1
            closes.append(node)
            current = "epilogue" if stage[layer] == 2 and layer == layers[-1] else current
    incomplete = [i for i in layers if stage.get(i) != 2]
    if incomplete or len(closes) != 2 * len(layers):
        raise SpeccError(f"decoder layer(s) {incomplete} lack an attention and an MLP each closed by a residual "
                         f"add (looked for SDPA, `{config.mlp_module_name}` submodules and `add` nodes of the layer "
                         f"module itself); insert_skip_branches supports pre-norm decoder layers only")
    streams = {}
    for layer in range(first_skippable, end_skippable):
        streams[f"attn_{layer}"] = closes[2 * layer - 1].name
        streams[f"mlp_{layer}"] = closes[2 * layer].name
    return partition, streams


def _mark_skip_branches(split: fx.GraphModule, streams: dict[str, str]) -> None:
    """Tag skippable calls and move the residual stream to their first input.

    split_module names a segment's inputs after the original nodes, so the
    stream input is the placeholder named after the residual add feeding it."""
    for call in split.graph.nodes:
        if call.op != "call_module" or call.target not in streams:
            continue
        segment = split.get_submodule(call.target)
        inputs = [n.target for n in segment.graph.nodes if n.op == "placeholder"]
        result = next(n for n in segment.graph.nodes if n.op == "output").args[0]
        if streams[call.target] not in inputs or not isinstance(result, fx.Node):
            raise SpeccError(f"segment {call.target} does not take one residual stream ({streams[call.target]}) "
                             f"and return one; it cannot get a skip branch")
        _move_input_first(segment, call, inputs.index(streams[call.target]))
        call.meta["specc_role"] = SKIP_BRANCH_ROLE


def _move_input_first(segment: fx.GraphModule, call: fx.Node, index: int) -> None:
    if index == 0:
        return
    placeholders = [n for n in segment.graph.nodes if n.op == "placeholder"]
    placeholders[0].prepend(placeholders[index])
    args = list(call.args)
    call.args = (args[index], *args[:index], *args[index + 1:])
    segment.recompile()
