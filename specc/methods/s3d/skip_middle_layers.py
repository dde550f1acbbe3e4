"""Skip a block of middle decoder layers: the residual stream leaving layer
m-1 goes straight into layer n+1.

S3D drafts with the target's early and late layers and skips a symmetric
block m..n in the middle (the paper keeps the bottom layers, which adapt the
representation, and the top ones, which give high-level features). The
skipped layers are removed by reachability from the output
(`remove_unreachable`), so their cache writes go with them: the cut graph
still takes every cache input, in order, and writes only the kept layers'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from specc.errors import UsageError
from specc.graph.nodes import layer_index
from specc.graph.patterns import layer_output, remove_unreachable
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult

DEFAULT_SKIP_RATIO = 0.33


@dataclass(frozen=True)
class SkipMiddleLayersConfig:
    """`first`, `last`: the skipped block (inclusive); None: a centred block of
    round(`ratio` · L) layers, never the first or the last layer."""

    first: int | None = None
    last: int | None = None
    ratio: float = DEFAULT_SKIP_RATIO

    def __post_init__(self):
        if (self.first is None) != (self.last is None):
            raise UsageError(f"skipped block {self.first}..{self.last}: give both its first and last layer, "
                             f"or neither to use a ratio")
        if not 0.0 <= self.ratio < 1.0:
            raise UsageError(f"skip ratio {self.ratio} must be in [0, 1)")

    def to_json(self) -> dict:
        return {"first": self.first, "last": self.last, "ratio": self.ratio}


def middle_block(num_layers: int, ratio: float) -> tuple[int, int] | None:
    """The centred block of round(ratio · L) layers (at most L - 2), or None if that rounds to none."""
    count = min(round(ratio * num_layers), num_layers - 2)
    if count <= 0:
        return None
    first = (num_layers - count) // 2
    return first, first + count - 1


def resolve_block(config: SkipMiddleLayersConfig, num_layers: int) -> tuple[int, int] | None:
    if config.first is None:
        return middle_block(num_layers, config.ratio)
    if not 1 <= config.first <= config.last <= num_layers - 2:
        raise UsageError(f"skipped block {config.first}..{config.last} must keep the first and the last layer of "
                         f"a {num_layers}-layer model: 1 <= first <= last <= {num_layers - 2}")
    return config.first, config.last


class SkipMiddleLayers(GraphPass):
    name = "skip_middle_layers"

    def __init__(self, config: SkipMiddleLayersConfig = SkipMiddleLayersConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        layers = decoder_layers(gm.graph)
        if not layers or layers != list(range(layers[-1] + 1)):   # no decoder layers, or a block is gone already
            return PassResult.unchanged(gm)
        block = resolve_block(self.config, len(layers))
        if block is None:
            return PassResult.unchanged(gm)
        first, last = block
        leaving = layer_output(gm.graph, last)
        leaving.replace_all_uses_with(layer_output(gm.graph, first - 1))
        remove_unreachable(gm.graph)
        tidy(gm)
        return PassResult(gm, True, replaced=[leaving.name])


def decoder_layers(graph: fx.Graph) -> list[int]:
    """The decoder layers a graph computes, in order."""
    return sorted({i for i in map(layer_index, graph.nodes) if i is not None})
