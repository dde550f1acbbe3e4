"""Give a decoder graph a learned mask token <M>: rows flagged by a boolean
input read one trained embedding instead of their token's.

S3D feeds the last real token followed by γ-1 mask tokens and predicts the
next γ tokens in one forward. The mask embedding is a parameter of the graph
(`draft_mask_token.weight`, [hidden], initialised to the mean token
embedding) rather than a new vocabulary row, so the tokenizer, the shared
embedding table and the LM head stay the target's. Which rows are masks is
the input `is_mask [1, q]` (bool), appended after the caches; the token id
of a masked row is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import operator

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import add_placeholder, attention_nodes, placeholder
from specc.graph.patterns import is_cached_attention, register_parameter
from specc.graph.signature import declare_input
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes

MASK_ROLE = "mask_tokens"
MASK_TOKEN_ROLE = "mask_token"   # specc_role of the nodes this pass adds


@dataclass(frozen=True)
class MaskTokensConfig:
    input_name: str = "is_mask"
    parameter_name: str = "draft_mask_token.weight"
    tokens_input: str = "input_ids"

    def to_json(self) -> dict:
        return {"input_name": self.input_name, "parameter_name": self.parameter_name,
                "tokens_input": self.tokens_input}


class InsertMaskTokens(GraphPass):
    name = "insert_mask_tokens"

    def __init__(self, config: MaskTokensConfig = MaskTokensConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        embedding = token_embedding(graph, self.config.tokens_input)
        if embedding is None or placeholder(graph, self.config.input_name) is not None:
            return PassResult.unchanged(gm)
        if any(not is_cached_attention(n) for n in attention_nodes(graph)):
            raise SpeccError("insert_mask_tokens appends its input after the KV caches: run insert_kv_cache first")
        before = set(graph.nodes)
        table = _attribute(gm, embedding.args[0])
        register_parameter(gm, self.config.parameter_name, table.detach().mean(dim=0))
        is_mask = declare_input(add_placeholder(graph, self.config.input_name), MASK_ROLE, "bool", (1, "q"))
        with graph.inserting_before(embedding.next):
            mask_row = graph.get_attr(self.config.parameter_name)
            flags = graph.call_function(torch.ops.aten.unsqueeze.default, (is_mask, -1))
            chosen = graph.call_function(torch.ops.aten.where.self, (flags, mask_row, embedding))
        embedding.replace_all_uses_with(chosen, delete_user_cb=lambda user: user is not chosen)
        for node in (mask_row, flags, chosen):
            node.meta["nn_module_stack"] = dict(embedding.meta.get("nn_module_stack") or {})
            node.meta["specc_role"] = MASK_TOKEN_ROLE
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=[embedding.name],
                          added_parameters=[self.config.parameter_name], added_inputs=[self.config.input_name])


def token_embedding(graph: fx.Graph, tokens_input: str) -> fx.Node | None:
    """The embedding lookup of the token input, if the graph has one."""
    tokens = placeholder(graph, tokens_input)
    if tokens is None:
        return None
    lookups = [u for u in tokens.users if u.op == "call_function" and u.target is torch.ops.aten.embedding.default]
    if len(lookups) > 1:
        raise SpeccError(f"expected one embedding lookup of {tokens_input}, found {[n.name for n in lookups]}")
    return lookups[0] if lookups else None


def _attribute(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor:
    if node.op != "get_attr":
        raise SpeccError(f"the embedding table {node.name} is not a parameter of the graph")
    return operator.attrgetter(node.target)(gm)
