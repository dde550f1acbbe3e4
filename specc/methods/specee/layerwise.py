"""Run a layer-segmented target one decoder layer at a time, leaving early when told.

`LayerwiseForward` walks the parent graph `segment_by_layer` produced from
the target with exit predictors (prologue, layer_0 … layer_{L-1},
epilogue), calling each segment's lowered callable. After a layer it hands
the layer's exit score and hidden state to a `decide` callback; when that
returns logits, the remaining layers do not run. What the layers above an
exit hold for the token is the KV policy's business:

- `propagate`: each skipped layer's K/V projections run on the exit state
  (a K/V-only copy of the layer's segment: everything but the cache writes
  is dead code and removed), so later tokens attend to something there;
- `mask`: nothing runs; the slot is marked missing for those layers and
  later queries' masks hide it per layer.

Positions and cache slots are the step's own everywhere: no layer keeps a
position counter of its own.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import output_node
from specc.graph.signature import read_signature
from specc.runtime.masks import apply_sliding_window

aten = torch.ops.aten


@dataclass
class LayerStep:
    call: fx.Node                 # the call_module node of the segment
    nodes: list[fx.Node]          # it and the glue after it, up to the next segment
    hidden_arg: int | None        # which argument is the residual stream coming in
    hidden_out: fx.Node | None    # the value carrying the residual stream out
    score: fx.Node | None         # the exit score this segment produces, if any


@dataclass
class LayerwiseResult:
    logits: torch.Tensor          # [1, q, vocab]
    exit_layer: int               # the last layer that ran (L-1: no early exit)
    hidden: torch.Tensor          # [1, q, hidden]: the residual stream leaving that layer


Decide = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor | None]


class LayerwiseForward:
    def __init__(self, gm: fx.GraphModule, lower: Callable[[fx.GraphModule], Callable], kv_policy: str,
                 sliding_window: int | None, mask_input: str = "attn_mask"):
        """`sliding_window`: the architecture's; every step's mask hides the keys it puts out of
        reach, as `CachedModel` does for whole-graph calls."""
        self.kv_policy = kv_policy
        self.sliding_window = sliding_window
        nodes = list(gm.graph.nodes)
        self._inputs = [n for n in nodes if n.op == "placeholder"]
        self._attributes = {n: operator.attrgetter(n.target)(gm) for n in nodes if n.op == "get_attr"}
        self._mask = next((n for n in self._inputs if n.target == mask_input), None)
        roles = read_signature(gm).inputs
        self._positions = next(n for n, spec in zip(self._inputs, roles) if spec.role == "positions")
        outputs = output_node(gm.graph).args[0]
        self.prologue, self.layers, self.epilogue = _stages(nodes, set(outputs[1:]) if isinstance(outputs, (tuple, list)) else set())
        self.num_layers = len(self.layers)
        self._segments = {s.call.target: lower(gm.get_submodule(s.call.target))
                          for s in [self.prologue, *self.layers, self.epilogue]}
        self._kv_only = ([lower(kv_only_segment(gm.get_submodule(s.call.target))) for s in self.layers]
                         if kv_policy == "propagate" else [])
        self.scored_layers = tuple(i for i, s in enumerate(self.layers) if s.score is not None)

    @property
    def static_sizes(self) -> set[int]:
        """Every dimension of the weights the segments read."""
        return {size for tensor in self._attributes.values() for size in tensor.shape}

    def run(self, inputs: tuple, decide: Decide | None = None, layer_masks: Callable | None = None,
            watch: Callable[[int, torch.Tensor], None] | None = None) -> LayerwiseResult:
        """Every segment in order; after layer i, `decide(i, score, hidden)` may return the
        exit logits. `layer_masks(i, mask)` gives layer i's attention mask (the `mask` policy);
        `watch(i, hidden)` sees every layer's output (calibration)."""
        env = self._bind(inputs)
        self._run_stage(self.prologue, env, None)
        for i, stage in enumerate(self.layers):
            self._run_stage(stage, env, layer_masks(i, env[self._mask]) if layer_masks else None)
            if watch is not None:
                watch(i, env[stage.hidden_out])
            if decide is None or stage.score is None:
                continue
            hidden = env[stage.hidden_out]
            logits = decide(i, env[stage.score], hidden)
            if logits is not None:
                if self.kv_policy == "propagate":
                    self._propagate(env, i, hidden)
                return LayerwiseResult(logits, i, hidden)
        self._run_stage(self.epilogue, env, None)
        return LayerwiseResult(env[self.epilogue.call], self.num_layers - 1, env[self.layers[-1].hidden_out])

    def head(self, hidden: torch.Tensor, inputs: tuple) -> torch.Tensor:
        """The epilogue (final norm, LM head) on any layer's hidden state: the guard's full logits."""
        env = self._bind(inputs)
        args = list(fx.node.map_arg(self.epilogue.call.args, lambda n: env.get(n)))
        args[self.epilogue.hidden_arg] = hidden
        return self._segments[self.epilogue.call.target](*args)

    def begin(self, inputs: tuple) -> dict:
        """The prologue on `inputs`: the environment `layer` steps (rows may change between layers:
        begin again with the remaining rows' inputs and pass their hidden state to `layer`)."""
        env = self._bind(inputs)
        self._run_stage(self.prologue, env, None)
        return env

    def _bind(self, inputs: tuple) -> dict:
        """The environment a run starts from: the weights and `inputs`, the mask windowed."""
        env: dict[fx.Node, object] = dict(self._attributes)
        env.update(zip(self._inputs, inputs))
        if self._mask is not None:
            env[self._mask] = apply_sliding_window(env[self._mask], env[self._positions], self.sliding_window)
        return env

    def layer(self, env: dict, i: int, hidden: torch.Tensor | None = None,
              mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layer i on `hidden` (None: what the environment holds); its output and exit score (or None)."""
        stage = self.layers[i]
        self._run_stage(stage, env, mask, hidden)
        return env[stage.hidden_out], (env[stage.score] if stage.score is not None else None)

    def propagate(self, inputs: tuple, exit_layer: int, hidden: torch.Tensor) -> None:
        """K/V of every layer above `exit_layer` for the rows of `inputs`, from their `hidden` there."""
        self._propagate(self.begin(inputs), exit_layer, hidden)

    def _run_stage(self, stage: LayerStep, env: dict, mask: torch.Tensor | None,
                   hidden: torch.Tensor | None = None) -> None:
        for node in stage.nodes:
            if node.op == "call_module":
                # A stage stepped on fresh rows has no earlier stage in `env`: only its hidden input did.
                args = list(fx.node.map_arg(node.args, env.__getitem__ if hidden is None else env.get))
                if mask is not None:
                    args = [mask if arg is self._mask else value for arg, value in zip(node.args, args)]
                if hidden is not None:
                    args[stage.hidden_arg] = hidden
                env[node] = self._segments[node.target](*args)
            elif node.op == "call_function":
                env[node] = node.target(*fx.node.map_arg(node.args, env.__getitem__),
                                        **fx.node.map_arg(node.kwargs, env.__getitem__))

    def _propagate(self, env: dict, exit_layer: int, hidden: torch.Tensor) -> None:
        """K/V of every layer above the exit, from the exit state."""
        for j in range(exit_layer + 1, self.num_layers):
            stage = self.layers[j]
            args = list(fx.node.map_arg(stage.call.args, lambda n: env.get(n)))
            args[stage.hidden_arg] = hidden
            self._kv_only[j](*args)


def kv_only_segment(segment: fx.GraphModule) -> fx.GraphModule:
    """A copy of a layer segment that only writes its K/V cache rows."""
    kv = copy.deepcopy(segment)
    writes = [n for n in kv.graph.nodes if n.op == "call_function" and n.target == aten.index_put_.default]
    if len(writes) != 2:
        raise SpeccError(f"a layer segment should write two caches (K and V), found {len(writes)} writes")
    output_node(kv.graph).args = (tuple(writes),)
    kv.graph.eliminate_dead_code()
    kv.graph.lint()
    kv.recompile()
    return kv


def _stages(nodes: list[fx.Node], scores: set) -> tuple[LayerStep, list[LayerStep], LayerStep]:
    calls = [n for n in nodes if n.op == "call_module"]
    names = [str(n.target) for n in calls]
    layer_calls = [n for n in calls if str(n.target).startswith("layer_")]
    if not calls or names[0] != "prologue" or names[-1] != "epilogue" or len(layer_calls) != len(calls) - 2:
        raise SpeccError(f"expected prologue, layer_0 … layer_N, epilogue segments; found {names}")
    groups: dict[fx.Node, list[fx.Node]] = {}
    current = None
    for node in nodes:
        if node.op == "call_module":
            current = node
            groups[current] = [node]
        elif node.op == "call_function" and current is not None:
            groups[current].append(node)
    stages = []
    for i, call in enumerate(calls):
        producer = calls[i - 1] if i > 0 else None
        stages.append(LayerStep(call, groups[call], _arg_from(call, producer), None,
                                next((n for n in groups[call] if n in scores), None)))
    for stage, consumer in zip(stages, stages[1:]):
        if consumer.hidden_arg is not None:
            stage.hidden_out = consumer.call.args[consumer.hidden_arg]
    return stages[0], stages[1:-1], stages[-1]


def _arg_from(call: fx.Node, producer: fx.Node | None) -> int | None:
    """The index of `call`'s argument that is `producer`'s output (or one of its items)."""
    if producer is None:
        return None
    for index, arg in enumerate(call.args):
        if arg is producer or (isinstance(arg, fx.Node) and arg.op == "call_function"
                               and arg.args and arg.args[0] is producer):
            return index
    raise SpeccError(f"segment {call.target} reads nothing from {producer.target}")
