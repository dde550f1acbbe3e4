"""Make position ids a graph input instead of an `arange` over the input.

Speculative verification feeds tokens whose positions are not consecutive
(tree siblings share a depth), so the rotary embedding must read positions
from an explicit input. Positions are global: one input for all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.graph.nodes import add_placeholder, module_path, placeholder
from specc.graph.signature import declare_input
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes


@dataclass(frozen=True)
class PositionIdsConfig:
    input_name: str = "position_ids"
    rotary_module_suffix: str = "rotary_emb"

    def to_json(self) -> dict:
        return {"input_name": self.input_name, "rotary_module_suffix": self.rotary_module_suffix}


class ExposePositionIds(GraphPass):
    name = "expose_position_ids"

    def __init__(self, config: PositionIdsConfig = PositionIdsConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        sources = self._position_sources(gm.graph)
        existing = placeholder(gm.graph, self.config.input_name)
        sources = [s for s in sources if s is not existing]
        if not sources:
            return PassResult.unchanged(gm)
        before = set(gm.graph.nodes)
        positions = existing or declare_input(add_placeholder(gm.graph, self.config.input_name),
                                              "positions", "int64", (1, "q"))
        replaced = []
        for source in sources:
            for user in list(source.users):
                if self._in_rotary(user):
                    user.replace_input_with(source, positions)
            replaced.append(source.name)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), replaced=replaced,
                          added_inputs=[self.config.input_name])

    def _in_rotary(self, node: fx.Node) -> bool:
        return module_path(node).endswith(self.config.rotary_module_suffix)

    def _position_sources(self, graph: fx.Graph) -> list[fx.Node]:
        """Integer tensors computed outside the rotary module that feed it."""
        sources: dict[fx.Node, None] = {}
        for node in graph.nodes:
            if not self._in_rotary(node):
                continue
            for operand in node.all_input_nodes:
                if operand.op in ("get_attr",) or self._in_rotary(operand):
                    continue
                if _is_integer_tensor(operand):
                    sources[operand] = None
        return list(sources)


def _is_integer_tensor(node: fx.Node) -> bool:
    val = node.meta.get("val")
    if node.op == "placeholder" and val is None:
        return True
    return isinstance(val, torch.Tensor) and not val.dtype.is_floating_point and val.dtype != torch.bool
