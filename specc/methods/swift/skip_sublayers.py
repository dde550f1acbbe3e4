"""Cut a fixed set of attention and MLP sublayers out of the graph: the
skipping model of one skip set as a single graph a backend can compile.

`insert_skip_branches` splits the target into segments so that the skip
set can change at run time; every draft step then calls about L segments
one by one, and on an ahead-of-time backend they run eagerly beside the
compiled target. Once a skip set is settled (SWIFT's compile-time search),
this pass cuts it out of an unsegmented copy of the target instead: the
residual add closing a skipped sublayer is replaced by the stream entering
it, and everything the output no longer needs goes (`remove_unreachable`),
so a skipped attention's cache write goes with it, as a skipped segment
writes nothing. The graph keeps every input, caches included, in order, so
it shares the target's KV cache like the segments do.

Sublayers are named as `insert_skip_branches` names its segments (`attn_3`,
`mlp_3`) and found the same way, from metadata only: a decoder layer's
residual `add` closes its attention when the layer's SDPA came before it,
its MLP when nodes of the layer's MLP module did. Running the pass again
changes nothing: a sublayer already cut has no residual add left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch.fx as fx

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import SDPA, layer_index, module_path
from specc.graph.patterns import is_residual_add, layer_path, remove_unreachable
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult

_SUBLAYER = re.compile(r"(attn|mlp)_(\d+)")


@dataclass(frozen=True)
class SkipSublayersConfig:
    skip: tuple[str, ...] = ()          # sublayer names: attn_{i}, mlp_{i}
    mlp_module_name: str = "mlp"

    def __post_init__(self):
        bad = [name for name in self.skip if not _SUBLAYER.fullmatch(name)]
        if bad:
            raise UsageError(f"cannot skip {', '.join(bad)}: sublayers are named attn_<layer> or mlp_<layer>")

    def to_json(self) -> dict:
        return {"skip": sorted(self.skip), "mlp_module_name": self.mlp_module_name}


class SkipSublayers(GraphPass):
    name = "skip_sublayers"

    def __init__(self, config: SkipSublayersConfig = SkipSublayersConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        closes = residual_closes(gm.graph, self.config.mlp_module_name)
        if not closes:
            return PassResult.unchanged(gm)
        _check_layers_exist(self.config.skip, closes)
        order = list(closes)
        replaced: dict[fx.Node, fx.Node] = {}
        for position, name in enumerate(order):
            if name not in self.config.skip:
                continue
            if position == 0:
                raise UsageError(f"cannot skip {name}: it reads the embedding, not a residual stream")
            stream = _resolve(closes[order[position - 1]], replaced)
            closes[name].replace_all_uses_with(stream)
            replaced[closes[name]] = stream
        if not replaced:
            return PassResult.unchanged(gm)
        remove_unreachable(gm.graph)
        tidy(gm)
        return PassResult(gm, True, replaced=[node.name for node in replaced])


def residual_closes(graph: fx.Graph, mlp_module_name: str = "mlp") -> dict[str, fx.Node]:
    """Each present sublayer's closing residual add, in graph order, keyed attn_{i} / mlp_{i}."""
    closes: dict[str, fx.Node] = {}
    seen: dict[int, set[str]] = {}      # per layer: sublayer kinds met since its last residual add
    for node in graph.nodes:
        layer = layer_index(node)
        if layer is None or node.op != "call_function":
            continue
        kinds = seen.setdefault(layer, set())
        if node.target == SDPA:
            kinds.add("attn")
        if module_path(node).startswith(f"{layer_path(node)}.{mlp_module_name}"):
            kinds.add("mlp")
        if is_residual_add(node) and kinds:
            if len(kinds) != 1:
                raise SpeccError(f"residual add {node.name} of layer {layer} closes both an attention and an MLP; "
                                 f"skip_sublayers supports sequential pre-norm decoder layers only")
            closes[f"{kinds.pop()}_{layer}"] = node
    return closes


def _check_layers_exist(skip: tuple[str, ...], closes: dict[str, fx.Node]) -> None:
    """A sublayer not among `closes` was cut before (idempotence) if its layer exists."""
    last_layer = max(int(_SUBLAYER.fullmatch(name).group(2)) for name in closes)
    missing = [name for name in skip if int(_SUBLAYER.fullmatch(name).group(2)) > last_layer]
    if missing:
        raise UsageError(f"cannot skip {', '.join(missing)}: the model has layers 0..{last_layer}")


def _resolve(node: fx.Node, replaced: dict[fx.Node, fx.Node]) -> fx.Node:
    while node in replaced:
        node = replaced[node]
    return node
