"""Run a quantized engine's attention through specc's row-by-row CPU kernel.

Under specc's blocked kernels (`quantize_linear_weights`, `q4`/`q6`/`q8`) each masked
`scaled_dot_product_attention` of every graph of the engine, its segments included (the
form `insert_kv_cache` leaves: `sdpa(query, keys, values, attn_mask, scale=…,
enable_gqa=…)` with a boolean mask) becomes `torch.ops.specc.row_attention(query, keys,
values, attn_mask, scale)`, the same computation with each query row computed on its own.
Every graph must take the same attention: a method's graph that kept PyTorch's (one with a
linear left, or segments) rounded its rows otherwise than the `none` engine and its tokens
drifted from `none`'s. A graph whose every linear is quantized then computes every row
alike at any row count, which the runtime reads from the node's `PADDED_ROWS` record as
`pad_attention_rows` leaves it (`graph.nodes.rows_computed_alike`), without the padded
rows PyTorch's attention needed and without its fixed cost per call: docs/quantization.md.
An attention call of another form is left for `pad_attention_rows`.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from specc.graph.nodes import PADDED_ROWS, attention_nodes, graph_modules
from specc.graph.tidy import tidy
from specc.kernels import row_attention  # noqa: F401  (registers torch.ops.specc.row_attention)
from specc.passes.base import GraphPass, PassResult

ROW_ATTENTION = torch.ops.specc.row_attention.default
_KNOWN_KWARGS = {"scale", "enable_gqa"}


class UseRowAttention(GraphPass):
    name = "use_row_attention"

    def __init__(self, rows: int):
        self.rows = rows   # recorded as the rows the call computes alike (any count does)

    def describe(self) -> dict:
        return {"rows": self.rows}

    def run(self, gm: fx.GraphModule) -> PassResult:
        inserted, replaced = [], []
        for module in graph_modules(gm):
            pending = [n for n in attention_nodes(module.graph) if _rewritable(n)]
            for sdpa in pending:
                replaced.append(sdpa.name)
                inserted.append(self._swap(module.graph, sdpa).name)
            if pending:
                tidy(module)
        if not replaced:
            return PassResult.unchanged(gm)
        return PassResult(gm, True, inserted=inserted, replaced=replaced)

    def _swap(self, graph: fx.Graph, sdpa: fx.Node) -> fx.Node:
        query, keys, values, mask = sdpa.args
        with graph.inserting_before(sdpa):
            kernel = graph.call_function(ROW_ATTENTION, (query, keys, values, mask),
                                         {"scale": sdpa.kwargs.get("scale")})
        kernel.meta.update(sdpa.meta)
        kernel.meta[PADDED_ROWS] = self.rows
        sdpa.replace_all_uses_with(kernel)
        graph.erase_node(sdpa)
        return kernel


def _rewritable(sdpa: fx.Node) -> bool:
    """The masked form, with a boolean mask (what specc's graphs carry: `runtime/masks.py`; a
    mask whose dtype the graph does not record counts as one, and the kernel checks it)."""
    if len(sdpa.args) != 4 or set(sdpa.kwargs) - _KNOWN_KWARGS or not isinstance(sdpa.args[3], fx.Node):
        return False
    mask, query = sdpa.args[3].meta.get("val"), sdpa.args[0].meta.get("val")
    return ((not isinstance(mask, torch.Tensor) or mask.dtype == torch.bool)
            and (not isinstance(query, torch.Tensor) or query.dtype in (torch.float32, torch.bfloat16)))
