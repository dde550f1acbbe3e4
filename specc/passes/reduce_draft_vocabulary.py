"""Give a draft graph an LM head over a subset of the vocabulary.

The LM head of a small model is a large share of its weights (SmolLM2-135M's:
benchmarks/NOTES.md#smollm2-135m-instruct), and a draft head pays for it
every draft step. A draft only has to propose likely tokens, so its head can
keep the rows of a frequency-ranked subset: the graph's logits become
`[1, q, N]` over `token_ids` (in that order), and the runtime maps a drafted
index i back to `token_ids[i]`. Verification keeps the full head, so greedy
and sampled decoding stay exact; a token outside the subset simply cannot be
drafted.

The new head is a frozen copy of the selected rows, a parameter of its own
(`<module_name>.weight`), so the shared target head is untouched; it is listed
in the graph's `FROZEN_COPIES`, so `--quantize` packs it as it packs the
model's own weights (4 bits under `q4`: it is not the target's head).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import FROZEN_COPIES, output_node
from specc.graph.patterns import lm_head
from specc.graph.signature import OUTPUTS_META, TensorSpec, declare_outputs
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult

aten = torch.ops.aten


@dataclass(frozen=True)
class DraftVocabularyConfig:
    token_ids: tuple[int, ...]
    module_name: str = "draft_head"

    def __post_init__(self):
        if not self.token_ids:
            raise UsageError("a reduced draft vocabulary needs at least one token id")
        if len(set(self.token_ids)) != len(self.token_ids):
            raise UsageError("the reduced draft vocabulary repeats a token id")

    def to_json(self) -> dict:
        return {"module_name": self.module_name, "size": len(self.token_ids)}


class ReduceDraftVocabulary(GraphPass):
    name = "reduce_draft_vocabulary"

    def __init__(self, config: DraftVocabularyConfig):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        if "logits" not in [spec["role"] for spec in output_node(gm.graph).meta.get(OUTPUTS_META, [])]:
            return PassResult.unchanged(gm)   # no head to reduce
        head = lm_head(gm.graph)
        weight_node = head.args[1]
        if weight_node.target == f"{self.config.module_name}.weight":
            return PassResult.unchanged(gm)
        if len(head.args) > 2 and head.args[2] is not None:
            raise SpeccError("the LM head has a bias; reducing its vocabulary would need the bias rows too")
        weight = operator.attrgetter(weight_node.target)(gm)
        ids = torch.tensor(self.config.token_ids, dtype=torch.long)
        if int(ids.max()) >= weight.shape[0] or int(ids.min()) < 0:
            raise SpeccError(f"draft vocabulary ids must lie in [0, {weight.shape[0]}); got {int(ids.min())}.."
                             f"{int(ids.max())}")
        module = torch.nn.Module()
        module.register_parameter("weight", torch.nn.Parameter(weight.detach()[ids].clone(), requires_grad=False))
        gm.add_submodule(self.config.module_name, module)
        gm.meta.setdefault(FROZEN_COPIES, set()).add(f"{self.config.module_name}.weight")   # quantizable
        with gm.graph.inserting_before(head):
            reduced = gm.graph.get_attr(f"{self.config.module_name}.weight")
        reduced.meta = dict(weight_node.meta)
        head.args = (head.args[0], reduced, *head.args[2:])
        _redeclare_logits(gm.graph, len(ids))
        tidy(gm)
        return PassResult(gm, True, inserted=[reduced.name], replaced=[weight_node.name],
                          added_parameters=[f"{self.config.module_name}.weight"])


def _redeclare_logits(graph: fx.Graph, size: int) -> None:
    output = output_node(graph)
    specs = [TensorSpec.from_json(spec) for spec in output.meta[OUTPUTS_META]]
    specs = [TensorSpec(s.name, s.role, s.dtype, (*s.shape[:-1], size)) if s.role == "logits" else s for s in specs]
    declare_outputs(graph, specs)


def reduced_head_passes(token_ids: list[int] | None, module_name: str = DraftVocabularyConfig.module_name
                        ) -> list[GraphPass]:
    """The pass that cuts a draft graph's head to `token_ids` (the method state's draft
    vocabulary), or none when compile-time training kept the whole head."""
    return [] if token_ids is None else [ReduceDraftVocabulary(DraftVocabularyConfig(tuple(token_ids), module_name))]

