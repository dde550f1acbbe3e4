"""Run a skip-branch graph with a run-time skip set.

`SkippingForward` walks the parent graph that `insert_skip_branches`
produced and calls each segment's lowered callable, except for the
segments in the skip set, whose output is their first input (the residual
stream). Each segment is lowered once; any skip set reuses the same
callables, so changing it never recompiles, and the segments write into
whatever KV cache they are given (the target's).
"""

from __future__ import annotations

import operator
from typing import Callable

import torch.fx as fx

from specc.errors import SpeccError
from specc.methods.swift.insert_skip_branches import skip_branches


class SkippingForward:
    """Callable with the graph's inputs, then the skip set (a frozenset of
    segment names) as one extra input, the way `CachedModel.run_all` passes
    method-specific inputs after the caches."""

    def __init__(self, gm: fx.GraphModule, lower: Callable[[fx.GraphModule], Callable]):
        self.skippable = tuple(skip_branches(gm))
        if not self.skippable:
            raise SpeccError("the graph has no skip branches; run insert_skip_branches on it first")
        self._nodes = list(gm.graph.nodes)
        self._num_inputs = sum(n.op == "placeholder" for n in self._nodes)
        self.segments = {n.target: lower(gm.get_submodule(n.target)) for n in self._nodes if n.op == "call_module"}
        self._attributes = {n: operator.attrgetter(n.target)(gm) for n in self._nodes if n.op == "get_attr"}

    @property
    def static_sizes(self) -> set[int]:
        """Every dimension of the weights the segments read."""
        return {size for tensor in self._attributes.values() for size in tensor.shape}

    def __call__(self, *inputs):
        graph_inputs, extra = inputs[: self._num_inputs], inputs[self._num_inputs:]
        skip = extra[0] if extra else frozenset()
        env: dict[fx.Node, object] = dict(self._attributes)
        fed = iter(graph_inputs)
        for node in self._nodes:
            if node.op == "placeholder":
                env[node] = next(fed)
            elif node.op == "call_module":
                args = fx.node.map_arg(node.args, env.__getitem__)
                env[node] = args[0] if node.target in skip else self.segments[node.target](*args)
            elif node.op == "call_function":
                env[node] = node.target(*fx.node.map_arg(node.args, env.__getitem__),
                                        **fx.node.map_arg(node.kwargs, env.__getitem__))
            elif node.op == "output":
                return fx.node.map_arg(node.args[0], env.__getitem__)
        raise SpeccError("skip-branch graph has no output node")
