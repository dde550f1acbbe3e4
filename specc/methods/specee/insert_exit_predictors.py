"""SpecEE's exit predictors: after decoder layers, score whether the token may leave.

After each predicted layer l the pass inserts, on the residual stream h_l:

    z_l = final_norm(h_l) · W_lm[candidates]ᵀ      (K logits: the reduced LM head)
    p_l = softmax(z_l);  Δ_l = p_l − p_{l−1}         (p_{l−1} from h_{l−1} the same way)
    s_l = sigmoid(W2 · relu(W1 · [z_l, p_l, Δ_l] + b1) + b2)

`candidates` `[q, K]` (a graph input, `exit_candidates`) are the draft
head's top-K token ids for each row. The final norm is a copy of the
graph's own (so every family's norm is right) and the reduced head gathers
the target's own LM-head rows, so z_l equals the full head's logits at the
candidates. Each layer's nodes carry that layer's module metadata, so
`segment_by_layer` puts them in the layer's segment and a runtime can read
`exit_score_l` as soon as layer l has run. Δ is taken against the layer
just below, recomputed inside layer l from its own input, which keeps each
layer's segment reading only the residual stream it already reads.

Predictor weights are parameters `exit_predictors.layer_<l>.{fc1,fc2}.
{weight,bias}` (3K → hidden → 1), initialised from the seed; SpecEE trains
them at compile time. The logits output is unchanged; the scores are
appended as outputs `exit_score_<l>` `[1, q, 1]` (role `exit_score`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import add_placeholder, attribute, layer_index, module_path, placeholder
from specc.graph.patterns import PASS_THROUGH, layer_output, lm_head
from specc.graph.signature import TensorSpec, append_outputs, declare_input
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes

aten = torch.ops.aten
SCORE_ROLE = "exit_score"
CANDIDATES_ROLE = "exit_candidates"
MODULE = "exit_predictors"


@dataclass(frozen=True)
class ExitPredictorConfig:
    layers: tuple[int, ...] | None = None   # None: every layer from first_layer to L-2 ("after layer l", 0-based)
    first_layer: int | None = None          # None: max(1, L // 3)
    candidates: int = 4                     # K
    hidden: int = 512
    candidates_input: str = "exit_candidates"
    seed: int = 0

    def __post_init__(self):
        if self.candidates < 1:
            raise UsageError(f"exit predictors need at least one candidate, got {self.candidates}")
        if self.hidden < 1:
            raise UsageError(f"exit predictor hidden size {self.hidden} must be positive")

    def to_json(self) -> dict:
        return {"layers": None if self.layers is None else list(self.layers), "first_layer": self.first_layer,
                "candidates": self.candidates,
                "hidden": self.hidden, "candidates_input": self.candidates_input, "seed": self.seed}


def score_name(layer: int) -> str:
    return f"exit_score_{layer}"


def predictor_layers(num_layers: int, layers: tuple[int, ...] | None = None,
                     first_layer: int | None = None) -> tuple[int, ...]:
    """The layers that get a predictor: each needs a layer below it (for Δ) and one above it to skip."""
    first = max(1, num_layers // 3) if first_layer is None else first_layer
    if layers is None and not 1 <= first <= num_layers - 2:
        raise UsageError(f"the first exit predictor layer {first} is out of range: a {num_layers}-layer model "
                         f"can exit after layers 1..{num_layers - 2}")
    chosen = tuple(range(first, num_layers - 1)) if layers is None else tuple(sorted(set(layers)))
    bad = [l for l in chosen if not 1 <= l <= num_layers - 2]
    if bad:
        raise UsageError(f"exit predictor layers {bad} are out of range: a {num_layers}-layer model can exit "
                         f"after layers 1..{num_layers - 2}")
    return chosen


class ExitPredictorMLP(torch.nn.Module):
    """3K → hidden → 1, the predictor's shape in the paper (12 → 512 → 1 for K = 4)."""

    def __init__(self, candidates: int, hidden: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(3 * candidates, hidden)
        self.fc2 = torch.nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc2(torch.relu(self.fc1(features))))


def predictor_features(z: torch.Tensor, z_below: torch.Tensor) -> torch.Tensor:
    """[z, p, Δ] from the reduced logits at a layer and at the layer below (eager twin of the graph)."""
    p = torch.softmax(z.float(), dim=-1).to(z.dtype)
    return torch.cat([z, p, p - torch.softmax(z_below.float(), dim=-1).to(z.dtype)], dim=-1)


class InsertExitPredictors(GraphPass):
    name = "insert_exit_predictors"

    def __init__(self, config: ExitPredictorConfig = ExitPredictorConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        layers = {i for i in map(layer_index, graph.nodes) if i is not None}
        if not layers or placeholder(graph, self.config.candidates_input) is not None:
            return PassResult.unchanged(gm)
        chosen = predictor_layers(max(layers) + 1, self.config.layers, self.config.first_layer)
        if not chosen:
            return PassResult.unchanged(gm)
        before = set(graph.nodes)
        head = lm_head(graph)
        norm = _final_norm(graph, head, max(layers))
        candidates = declare_input(add_placeholder(graph, self.config.candidates_input), CANDIDATES_ROLE,
                                   "int64", ("q", self.config.candidates))
        generator = torch.Generator().manual_seed(self.config.seed)
        dtype = attribute(gm, head.args[1].target).dtype
        scores, added = [], []
        for layer in chosen:
            predictor = ExitPredictorMLP(self.config.candidates, self.config.hidden)
            _seeded_init(predictor, generator)
            predictor.to(dtype)   # the graph's floating dtype: its reduced logits feed the predictor
            prefix = f"{MODULE}.layer_{layer}"
            gm.add_submodule(prefix, predictor)
            added += [f"{prefix}.{name}" for name, _ in predictor.named_parameters()]
            scores.append(self._score(gm, layer, norm, head.args[1].target, candidates, prefix))
        self._append_outputs(graph, scores, chosen)
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), added_parameters=added,
                          added_inputs=[self.config.candidates_input])

    def _score(self, gm, layer, norm, head_weight: str, candidates, prefix) -> fx.Node:
        graph = gm.graph
        h, h_below = layer_output(graph, layer), layer_output(graph, layer - 1)
        builder = _Builder(graph, h.meta.get("nn_module_stack"))
        with graph.inserting_before(h.next):
            rows = builder.call(aten.embedding.default, builder.attr(head_weight), candidates)   # [q, K, H]
            z, z_below = (builder.reduced_logits(norm, source, rows) for source in (h, h_below))
            p = builder.call(aten._softmax.default, z, -1, False)
            p_below = builder.call(aten._softmax.default, z_below, -1, False)
            delta = builder.call(aten.sub.Tensor, p, p_below)
            features = builder.call(aten.cat.default, [z, p, delta], -1)
            hidden = builder.call(aten.linear.default, features, builder.attr(f"{prefix}.fc1.weight"),
                                  builder.attr(f"{prefix}.fc1.bias"))
            hidden = builder.call(aten.relu.default, hidden)
            logit = builder.call(aten.linear.default, hidden, builder.attr(f"{prefix}.fc2.weight"),
                                 builder.attr(f"{prefix}.fc2.bias"))
            score = builder.call(aten.sigmoid.default, logit)
            return builder.call(aten.unsqueeze.default, score, 0)

    def _append_outputs(self, graph: fx.Graph, scores: list[fx.Node], layers: tuple[int, ...]) -> None:
        append_outputs(graph, scores, [TensorSpec(score_name(l), SCORE_ROLE, "float", (1, "q", 1)) for l in layers])


class _Builder:
    """Appends nodes in order at the insertion point, each tagged as part of one decoder layer."""

    def __init__(self, graph: fx.Graph, module_stack):
        self.graph = graph
        self.stack = module_stack

    def call(self, target, *args) -> fx.Node:
        return self._tag(self.graph.call_function(target, args))

    def attr(self, name: str) -> fx.Node:
        return self._tag(self.graph.get_attr(name))

    def reduced_logits(self, norm: "_FinalNorm", hidden: fx.Node, rows: fx.Node) -> fx.Node:
        """[q, K]: the final norm of `hidden` [1, q, H] against the candidate rows [q, K, H]."""
        normed = norm.copy_onto(self, hidden)
        column = self.call(aten.unsqueeze.default, self.call(aten.select.int, normed, 0, 0), -1)   # [q, H, 1]
        return self.call(aten.squeeze.dim, self.call(aten.bmm.default, rows, column), -1)

    def _tag(self, node: fx.Node) -> fx.Node:
        if self.stack:
            node.meta["nn_module_stack"] = dict(self.stack)
        return node


@dataclass
class _FinalNorm:
    """The nodes of the graph's final norm, from the last layer's output to the LM head's input."""

    source: fx.Node
    nodes: list[fx.Node]

    def copy_onto(self, builder: _Builder, hidden: fx.Node) -> fx.Node:
        env = {self.source: hidden}
        for node in self.nodes:
            if node.op == "get_attr":
                env[node] = builder.attr(node.target)
            else:
                env[node] = builder._tag(builder.graph.node_copy(node, lambda n: env.get(n, n)))
        return env[self.nodes[-1]]


def _final_norm(graph: fx.Graph, head: fx.Node, last_layer: int) -> _FinalNorm:
    source = layer_output(graph, last_layer)
    end = head.args[0]
    while end.op == "call_function" and end.target in PASS_THROUGH and not module_path(end):
        end = end.args[0]
    path = module_path(end)
    if not path or layer_index(end) is not None:
        raise SpeccError(f"expected the LM head to read a final norm, found {end.name} ({path or 'no module'})")
    members, frontier = set(), [end]
    while frontier:
        node = frontier.pop()
        if node in members or node is source:
            continue
        if node.op != "get_attr" and module_path(node) != path:
            raise SpeccError(f"the final norm {path!r} reads {node.name}, which is neither its own node nor "
                             f"the last layer's output")
        members.add(node)
        frontier += [a for a in node.all_input_nodes]
    return _FinalNorm(source, [n for n in graph.nodes if n in members])


def _seeded_init(module: torch.nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for p in module.parameters():
            bound = 1.0 / max(1, p.shape[-1]) ** 0.5
            p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)


def predictor_parameters(gm: torch.nn.Module, layer: int) -> dict[str, torch.nn.Parameter]:
    """Layer `layer`'s predictor parameters by short name (`fc1.weight`, …), wherever the graph keeps them."""
    prefix = f"{MODULE}.layer_{layer}."
    return {name[len(prefix):]: p for name, p in gm.named_parameters() if name.startswith(prefix)}


def apply_predictor(parameters: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
    """The predictor's score for features [N, 3K] (eager twin of the inserted nodes)."""
    linear = torch.nn.functional.linear
    hidden = torch.relu(linear(features, parameters["fc1.weight"], parameters["fc1.bias"]))
    return torch.sigmoid(linear(hidden, parameters["fc2.weight"], parameters["fc2.bias"]))
