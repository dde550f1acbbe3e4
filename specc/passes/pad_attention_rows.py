"""Pad each attention call's query rows to a fixed count, inside the graph.

In bfloat16 a call's row count changes how the CPU kernels round a row, so the
runtime runs every call of fewer than `EXACT_ROWS` rows padded to that many
(`lower/row_padding.py`) and a verification rounds like a decode step. On a
quantized engine (`quantize_linear_weights`) that padding costs much of what the
quantized matmuls save: the weight-only kernels compute a row the same way at any
row count but take longer for four rows than for one, and of the rest of the graph
only attention rounds rows differently (measurements: docs/quantization.md). So,
once every linear is quantized, this pass pads where it matters only:

    padded = max(q, rows)
    out    = sdpa(cat([query, last query row repeated rows times])[:, :, :padded], …,
                  cat([mask, last mask row repeated rows times])[:, :, :padded])[:, :, :q]

and the runtime runs such a graph's calls unpadded (`graph.nodes.rows_computed_alike`).
A graph with a linear left (a head a method trained) or with segments is left alone.

The repeat has a fixed length (`rows` copies, cut back to `padded`): `torch.export` guards
a symbolic repeat's length against 0 and 1, so a package traced at one row count refused
calls whose padding differed (`specc.lower.aoti` traces these graphs below `rows`).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from specc.graph.nodes import PADDED_ROWS, attention_nodes, weights_all_quantized
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes

aten = torch.ops.aten
QUERY_AXIS = 2   # sdpa's query is [batch, heads, q, head_dim], its mask [batch, 1, q, kv]


class PadAttentionRows(GraphPass):
    name = "pad_attention_rows"

    def __init__(self, rows: int):
        self.rows = rows

    def describe(self) -> dict:
        return {"rows": self.rows}

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        pending = [n for n in attention_nodes(graph) if PADDED_ROWS not in n.meta]
        if not pending or not weights_all_quantized(gm):
            return PassResult.unchanged(gm)
        before = set(graph.nodes)
        for sdpa in pending:
            self._pad(graph, sdpa)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=[n.name for n in pending])

    def _pad(self, graph: fx.Graph, sdpa: fx.Node) -> None:
        query, mask = sdpa.args[0], sdpa.args[3] if len(sdpa.args) > 3 else sdpa.kwargs.get("attn_mask")
        if not isinstance(mask, fx.Node):
            raise ValueError(f"{sdpa.name} has no mask input: run after insert_attention_mask")
        call = graph.call_function
        with graph.inserting_before(sdpa):
            rows = call(aten.sym_size.int, (query, QUERY_AXIS))
            kept = call(torch.sym_max, (rows, self.rows))
            padded = [call(aten.slice.Tensor, (call(aten.cat.default, ([tensor, _last_rows(graph, tensor, self.rows)],
                                                                        QUERY_AXIS)), QUERY_AXIS, 0, kept))
                      for tensor in (query, mask)]
        sdpa.args = (padded[0], *sdpa.args[1:3], padded[1], *sdpa.args[4:])
        with graph.inserting_after(sdpa):
            real = call(aten.slice.Tensor, (sdpa, QUERY_AXIS, 0, rows))
        sdpa.replace_all_uses_with(real, delete_user_cb=lambda user: user is not real)
        sdpa.meta[PADDED_ROWS] = self.rows


def _last_rows(graph: fx.Graph, tensor: fx.Node, count: int) -> fx.Node:
    """`tensor`'s last row along the query axis, repeated `count` times (a view)."""
    call = graph.call_function
    last = call(aten.slice.Tensor, (tensor, QUERY_AXIS, -1, None))
    return call(aten.expand.default, (last, [-1, -1, count, -1]))
