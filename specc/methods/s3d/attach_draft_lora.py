"""Attach low-rank adapters (LoRA) to the projections of a draft graph's decoder layers.

Every `linear(x, W)` of a layer's attention (and, with `mlp`, of its MLP)
becomes `linear(x, W) + scale · linear(linear(x, A), B)` with A [r, in] and
B [out, r] parameters of the graph's own, under `draft_lora.<module path>.
lora_a / lora_b` (scale = alpha / r). B starts at zero, so an untrained
adapter computes exactly what the projection did; A starts uniform in
±1/sqrt(in) from a seeded generator (PEFT's initialisation), so it is
deterministic. The frozen weights W are untouched and shared: a graph
without this pass (the target) never computes the adapters.

The projections are found by module metadata (`layers.<i>.self_attn.*`,
`layers.<i>.mlp.*`), so fused projections (Phi-3's `qkv_proj`,
`gate_up_proj`) get one adapter each, and only layers still in the graph
(not skipped) get any.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import UsageError
from specc.graph.nodes import module_path
from specc.graph.patterns import register_parameter
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes

LORA_ROLE = "draft_lora"
_ATTENTION = re.compile(r"(?:^|\.)layers\.\d+\.self_attn\.")
_MLP = re.compile(r"(?:^|\.)layers\.\d+\.mlp\.")


@dataclass(frozen=True)
class DraftLoraConfig:
    rank: int = 8
    alpha: float = 16.0
    mlp: bool = False          # adapters on the MLP projections too (attention projections always)
    seed: int = 0
    module_name: str = "draft_lora"

    def __post_init__(self):
        if self.rank < 1:
            raise UsageError(f"LoRA rank {self.rank} must be at least 1")
        if self.alpha <= 0:
            raise UsageError(f"LoRA alpha {self.alpha} must be positive")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "mlp": self.mlp, "seed": self.seed,
                "module_name": self.module_name}


class AttachDraftLora(GraphPass):
    name = "attach_draft_lora"

    def __init__(self, config: DraftLoraConfig = DraftLoraConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        if any(n.op == "get_attr" and str(n.target).startswith(self.config.module_name + ".") for n in graph.nodes):
            return PassResult.unchanged(gm)
        projections = [n for n in graph.nodes if self._adapts(n)]
        if not projections:
            return PassResult.unchanged(gm)
        before = set(graph.nodes)
        generator = torch.Generator().manual_seed(self.config.seed)
        added = []
        for projection in projections:
            added += self._adapt(gm, projection, generator)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=[n.name for n in projections],
                          added_parameters=added)

    def _adapts(self, node: fx.Node) -> bool:
        if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
            return False
        path = module_path(node)
        return bool(_ATTENTION.search(path) or (self.config.mlp and _MLP.search(path)))

    def _adapt(self, gm: fx.GraphModule, projection: fx.Node, generator: torch.Generator) -> list[str]:
        graph = gm.graph
        weight = operator.attrgetter(projection.args[1].target)(gm)
        out_features, in_features = weight.shape
        prefix = f"{self.config.module_name}.{module_path(projection)}"
        bound = 1.0 / math.sqrt(in_features)
        down = (torch.rand(self.config.rank, in_features, generator=generator) * 2 - 1) * bound
        register_parameter(gm, f"{prefix}.lora_a", down.to(weight.dtype))
        register_parameter(gm, f"{prefix}.lora_b", torch.zeros(out_features, self.config.rank, dtype=weight.dtype))
        with graph.inserting_before(projection.next):   # in order, right after the projection
            a = graph.get_attr(f"{prefix}.lora_a")
            b = graph.get_attr(f"{prefix}.lora_b")
            reduced = graph.call_function(torch.ops.aten.linear.default, (projection.args[0], a))
            expanded = graph.call_function(torch.ops.aten.linear.default, (reduced, b))
            scaled = graph.call_function(torch.ops.aten.mul.Tensor, (expanded, self.config.scale))
            adapted = graph.call_function(torch.ops.aten.add.Tensor, (projection, scaled))
        projection.replace_all_uses_with(adapted, delete_user_cb=lambda user: user is not adapted)
        for node in (a, b, reduced, expanded, scaled, adapted):
            node.meta["nn_module_stack"] = dict(projection.meta.get("nn_module_stack") or {})
            node.meta["specc_role"] = LORA_ROLE
        return [f"{prefix}.lora_a", f"{prefix}.lora_b"]
