"""Window the sliding-attention layers of a checkpoint that mixes attention kinds.

Gemma 2/3, GPT-OSS and Qwen2 with `max_window_layers` interleave layers that
attend to every earlier token with layers that attend to the last W only. The
runtime builds one mask (causal, tree or packed) for every layer; this pass
gives each sliding layer that mask with the keys more than W positions behind
its query hidden, computed in the graph from the graph's own inputs:

    key_position = arange(kv).scatter(0, cache_slots, positions)   # slot → position
    windowed     = mask & (key_position > positions[:, None] - W)

A committed slot holds the token of that position; this call's rows sit at
`cache_slots` with `positions` (tree siblings share one, packed training
windows restart theirs), so the windows are exact for prefill, trees and
packed windows alike, which is what Hugging Face's
`sliding_window_causal_mask_function` computes (`kv_idx > q_idx - W`).

Capture tags each sliding layer's attention call with its window
(`ATTENTION_WINDOW`, `specc.capture.export`); run after `insert_kv_cache`.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import ATTENTION_WINDOW, WINDOWED_MASK, attention_nodes, placeholder
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes

aten = torch.ops.aten

MASK_INPUT, POSITIONS_INPUT, SLOTS_INPUT = "attn_mask", "position_ids", "cache_positions"


class WindowSlidingLayers(GraphPass):
    name = "window_sliding_layers"

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        pending = [n for n in attention_nodes(graph) if n.meta.get(ATTENTION_WINDOW) and not _windowed(n)]
        if not pending:
            return PassResult.unchanged(gm)
        inputs = [placeholder(graph, name) for name in (MASK_INPUT, POSITIONS_INPUT, SLOTS_INPUT)]
        if any(node is None for node in inputs):
            raise SpeccError("window_sliding_layers needs the attn_mask, position_ids and cache_positions inputs: "
                             "run it after insert_kv_cache")
        before = set(graph.nodes)
        made: dict[int, fx.Node] = {}
        for sdpa in pending:
            window = sdpa.meta[ATTENTION_WINDOW]
            if window not in made:
                made[window] = _windowed_mask(graph, *inputs, window)
            sdpa.args = (*sdpa.args[:3], made[window], *sdpa.args[4:])
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=[n.name for n in pending])


def _windowed(sdpa: fx.Node) -> bool:
    mask = sdpa.args[3] if len(sdpa.args) > 3 else None
    return isinstance(mask, fx.Node) and WINDOWED_MASK in mask.meta


def _windowed_mask(graph: fx.Graph, mask: fx.Node, positions: fx.Node, slots: fx.Node, window: int) -> fx.Node:
    """`mask` [1, 1, q, kv] & (key position > query position - window), computed before the layers."""
    after_inputs = [n for n in graph.nodes if n.op == "placeholder"][-1].next
    call = graph.call_function
    with graph.inserting_before(after_inputs):
        kv = call(aten.sym_size.int, (mask, 3))
        slot_ids = call(aten.arange.default, (kv,), {"dtype": torch.int64, "device": _device_of(mask)})
        row_positions = call(aten.select.int, (positions, 0, 0))                        # [q]
        key_positions = call(aten.scatter.src, (slot_ids, 0, slots, row_positions))     # [kv]
        earliest = call(aten.sub.Tensor, (row_positions, window - 1))                  # [q]
        keys = call(aten.unsqueeze.default, (key_positions, 0))                         # [1, kv]
        rows = call(aten.unsqueeze.default, (earliest, 1))                              # [q, 1]
        visible = call(aten.ge.Tensor, (keys, rows))                                    # [q, kv]
        windowed = call(aten.logical_and.default, (mask, visible))
    windowed.meta[WINDOWED_MASK] = window
    return windowed


def _device_of(node: fx.Node) -> torch.device:
    value = node.meta.get("val")
    return value.device if isinstance(value, torch.Tensor) else torch.device("cpu")
