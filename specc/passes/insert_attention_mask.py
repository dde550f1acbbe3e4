"""Feed every attention call one boolean mask from a graph input.

Plain causal decoding is the chain case of a tree mask; making the mask an
input lets the runtime verify a flattened token tree in one forward. The
mask is `[1, 1, q_len, kv_len]`, True where a query may attend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from specc.graph.nodes import WINDOWED_MASK, add_placeholder, attention_nodes, placeholder
from specc.graph.signature import declare_input
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes


@dataclass(frozen=True)
class AttentionMaskConfig:
    input_name: str = "attn_mask"

    def to_json(self) -> dict:
        return {"input_name": self.input_name}


class InsertAttentionMask(GraphPass):
    name = "insert_attention_mask"

    def __init__(self, config: AttentionMaskConfig = AttentionMaskConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        mask = placeholder(gm.graph, self.config.input_name)
        pending = [n for n in attention_nodes(gm.graph) if not _uses_mask(n, mask)]
        if not pending:
            return PassResult.unchanged(gm)
        before = set(gm.graph.nodes)
        mask = mask or declare_input(add_placeholder(gm.graph, self.config.input_name),
                                     "attention_mask", "bool", (1, 1, "q", "kv"))
        for sdpa in pending:
            query, key, value = sdpa.args[:3]
            kwargs = {k: v for k, v in sdpa.kwargs.items() if k not in ("attn_mask", "is_causal", "dropout_p")}
            sdpa.args = (query, key, value, mask)
            sdpa.kwargs = kwargs
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm),
                          replaced=[n.name for n in pending], added_inputs=[self.config.input_name])


def _uses_mask(sdpa: fx.Node, mask: fx.Node | None) -> bool:
    """Whether `sdpa` reads the mask input, directly or windowed (`window_sliding_layers`)."""
    current = sdpa.args[3] if len(sdpa.args) > 3 else sdpa.kwargs.get("attn_mask")
    windowed = isinstance(current, fx.Node) and WINDOWED_MASK in current.meta and current.args[0] is mask
    return mask is not None and (current is mask or windowed)
