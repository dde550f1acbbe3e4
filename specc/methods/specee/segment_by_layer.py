"""Split a graph into one submodule per decoder layer.

The result calls `prologue` (embedding, rotary tables), `layer_0` …
`layer_{L-1}`, then `epilogue` (final norm, LM head) in order, so a method
can run any contiguous range of layers by calling those submodules with
the values the parent graph passes between them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx
from torch.fx.passes.split_module import split_module

from specc.graph.nodes import calls_submodules, layer_index
from specc.graph.patterns import partition_order, rename_submodules
from specc.passes.base import GraphPass, PassResult


@dataclass(frozen=True)
class SegmentConfig:
    def to_json(self) -> dict:
        return {}


class SegmentByLayer(GraphPass):
    name = "segment_by_layer"

    def __init__(self, config: SegmentConfig = SegmentConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        if calls_submodules(gm, ("layer_", "prologue")):
            return PassResult.unchanged(gm)
        partition = _partition_by_layer(gm.graph)
        if not any(p.startswith("layer_") for p in partition.values()):
            return PassResult.unchanged(gm)
        order = partition_order(partition)
        split = split_module(gm, gm, lambda node: order[partition[node]], keep_original_order=True)
        names = {f"submod_{i}": name for name, i in order.items()}
        rename_submodules(split, names)
        split.graph.lint()
        split.recompile()
        return PassResult(split, True, inserted=sorted(names.values(), key=lambda n: order[n]))


def _partition_by_layer(graph: fx.Graph) -> dict[fx.Node, str]:
    """Each compute node goes to its decoder layer; glue before the first
    layer is prologue, glue after a layer stays with it, the tail after the
    last layer's residual is epilogue."""
    partition: dict[fx.Node, str] = {}
    current = "prologue"
    last_layer_node = max((n for n in graph.nodes if layer_index(n) is not None), key=_position(graph), default=None)
    passed_last = False
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        layer = layer_index(node)
        if layer is not None:
            current = f"layer_{layer}"
        elif passed_last:
            current = "epilogue"
        partition[node] = current
        if node is last_layer_node:
            passed_last = True
    return partition


def _position(graph: fx.Graph):
    index = {node: i for i, node in enumerate(graph.nodes)}
    return index.__getitem__




