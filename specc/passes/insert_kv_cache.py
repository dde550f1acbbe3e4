"""Give every attention layer a preallocated KV cache, updated in place.

Each attention call gets two graph inputs, `k_cache_{layer}` and
`v_cache_{layer}` of shape `[1, kv_heads, max_seq_len, head_dim]`. The new
keys/values (before any grouped-query repeat) are written with
`index_put_` at the slots named by the `cache_positions` input, and the
attention reads the first `kv_len` slots, where `kv_len` is the mask's
last dimension. Nothing copies the whole cache: the write touches q_len
rows and the read is a view.

Requires the attention-mask input (run `insert_attention_mask` first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import add_placeholder, attention_nodes, layer_index, placeholder
from specc.graph.patterns import declare_cache_input, is_cached_attention
from specc.graph.signature import declare_input
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes

aten = torch.ops.aten


@dataclass(frozen=True)
class KVCacheConfig:
    cache_positions_name: str = "cache_positions"
    mask_input_name: str = "attn_mask"

    def to_json(self) -> dict:
        return {"cache_positions_name": self.cache_positions_name, "mask_input_name": self.mask_input_name}


def cache_input_names(layer: int) -> tuple[str, str]:
    return f"k_cache_{layer}", f"v_cache_{layer}"


class InsertKVCache(GraphPass):
    name = "insert_kv_cache"

    def __init__(self, config: KVCacheConfig = KVCacheConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        pending = [n for n in attention_nodes(gm.graph) if not is_cached_attention(n)]
        if not pending:
            return PassResult.unchanged(gm)
        mask = placeholder(gm.graph, self.config.mask_input_name)
        if mask is None:
            raise SpeccError("insert_kv_cache needs the attention-mask input: run insert_attention_mask first")
        before = set(gm.graph.nodes)
        slots = placeholder(gm.graph, self.config.cache_positions_name) or declare_input(
            add_placeholder(gm.graph, self.config.cache_positions_name), "cache_slots", "int64", ("q",))
        added = [self.config.cache_positions_name]
        for sdpa in pending:
            added += self._cache_layer(gm.graph, sdpa, slots, mask)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm),
                          replaced=[n.name for n in pending], added_inputs=added)

    def _cache_layer(self, graph: fx.Graph, sdpa: fx.Node, slots: fx.Node, mask: fx.Node) -> list[str]:
        layer = layer_index(sdpa)
        if layer is None:
            raise SpeccError(f"attention node {sdpa.name} has no decoder-layer metadata (nn_module_stack)")
        names = cache_input_names(layer)
        if placeholder(graph, names[0]) is not None:
            raise SpeccError(f"two attention calls claim decoder layer {layer}; cannot assign one KV cache each")
        query, key, value = sdpa.args[:3]
        k_cache, v_cache = (declare_cache_input(add_placeholder(graph, name)) for name in names)
        with graph.inserting_before(sdpa):
            kv_len = graph.call_function(aten.sym_size.int, (mask, 3))
            keys = _write_then_read(graph, k_cache, slots, _before_repeat(key), kv_len)
            values = _write_then_read(graph, v_cache, slots, _before_repeat(value), kv_len)
        sdpa.args = (query, keys, values, mask)
        sdpa.kwargs = {**sdpa.kwargs, "enable_gqa": True}
        return list(names)


def _write_then_read(graph, cache, slots, new_rows, kv_len) -> fx.Node:
    written = graph.call_function(aten.index_put_.default, (cache, [None, None, slots], new_rows))
    return graph.call_function(aten.slice.Tensor, (written, 2, 0, kv_len))


def _before_repeat(node: fx.Node) -> fx.Node:
    """Undo HF's repeat_kv (unsqueeze → expand → reshape) to cache kv heads only."""
    if node.target in (aten.reshape.default, aten.view.default, aten._unsafe_view.default):
        expanded = node.args[0]
        if isinstance(expanded, fx.Node) and expanded.target == aten.expand.default:
            unsqueezed = expanded.args[0]
            if isinstance(unsqueezed, fx.Node) and unsqueezed.target == aten.unsqueeze.default and unsqueezed.args[1] == 2:
                return unsqueezed.args[0]
    return node


