"""Which weights a serialized graph reads whole: every attribute a node takes, except a table only
looked up by `aten.embedding`; attributes of called submodules by their full names."""

from __future__ import annotations

import torch
import torch.fx as fx

from specc.graph.serialize import attributes_streamed, graph_to_json


def _graph(tied: bool) -> fx.GraphModule:
    root = torch.nn.Module()
    for name in ("table", "head", "norm"):
        root.register_buffer(name, torch.ones(4, 4))
    layer = torch.nn.Module()
    layer.register_buffer("weight", torch.ones(4, 4))
    inner = fx.Graph()
    x = inner.placeholder("x")
    w = inner.get_attr("weight")
    inner.output(inner.call_function(torch.ops.aten.mm.default, (x, w)))
    root.add_module("layer", fx.GraphModule(layer, inner))

    graph = fx.Graph()
    ids = graph.placeholder("ids")
    table = graph.get_attr("table")
    hidden = graph.call_function(torch.ops.aten.embedding.default, (table, ids))
    hidden = graph.call_module("layer", (hidden,))
    hidden = graph.call_function(torch.ops.aten.mul.Tensor, (hidden, graph.get_attr("norm")))
    head = table if tied else graph.get_attr("head")
    logits = graph.call_function(torch.ops.aten.linear.default, (hidden,), {"weight": head})
    graph.output((logits,))
    return fx.GraphModule(root, graph)


def test_a_table_only_looked_up_is_not_streamed():
    assert attributes_streamed(graph_to_json(_graph(tied=False))) == {"head", "norm", "layer.weight"}


def test_a_table_that_is_also_the_head_is_streamed():
    assert attributes_streamed(graph_to_json(_graph(tied=True))) == {"table", "norm", "layer.weight"}
