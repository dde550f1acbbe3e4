"""Compute logits only for the rows a call asks for: a `logit_rows` input before the LM head.

A prompt's prefill needs the next-token logits of its last row only, yet the
captured graph applies the LM head to every row: on SmolLM2-135M (a 49,152-row
head over 576 features) that is a sixth of a 125-token bfloat16 prefill on the
CPU, and `rows × vocab` floats of memory a long prompt did not need. This pass
adds an input `logit_rows [r]` (int64 row indices, `r` dynamic) and gathers
those rows of the head's input before the head, so the `logits` output becomes
`[1, r, vocab]`. The runtime (`CachedModel`) asks for every row, except in a
prefill, which asks for the last; row padding pads `r` with `q`
(`specc.lower.row_padding`), so a verification's head runs over as many rows as
a decode step's and rounds each row the same way.

It runs on every graph of an engine, after the method's passes and before
`use_kernels`, and not on the graphs training runs; a graph without a linear
LM head behind its logits (or with no logits) is left unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import add_placeholder, output_node, placeholder
from specc.graph.patterns import lm_head
from specc.graph.signature import (LOGIT_ROWS_DIM, LOGIT_ROWS_ROLE, LOGITS_ROLE, OUTPUTS_META, TensorSpec,
                                   declare_input, declared_outputs, declare_outputs)
from specc.graph.tidy import tidy
from specc.passes.base import GraphPass, PassResult, new_nodes


@dataclass(frozen=True)
class LogitRowsConfig:
    input_name: str = "logit_rows"

    def to_json(self) -> dict:
        return {"input_name": self.input_name}


class SelectLogitRows(GraphPass):
    name = "select_logit_rows"

    def __init__(self, config: LogitRowsConfig = LogitRowsConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        head = self._head(gm.graph)
        if head is None or placeholder(gm.graph, self.config.input_name) is not None:
            return PassResult.unchanged(gm)
        before = set(gm.graph.nodes)
        rows = declare_input(add_placeholder(gm.graph, self.config.input_name), LOGIT_ROWS_ROLE, "int64",
                             (LOGIT_ROWS_DIM,))
        hidden = head.args[0]
        with gm.graph.inserting_before(head):
            selected = gm.graph.call_function(torch.ops.aten.index_select.default, (hidden, 1, rows))
        if "nn_module_stack" in head.meta:
            selected.meta["nn_module_stack"] = head.meta["nn_module_stack"]
        head.replace_input_with(hidden, selected)
        declare_outputs(gm.graph, [_rows_of(spec) if spec.role == LOGITS_ROLE else spec
                                   for spec in declared_outputs(gm.graph)])
        tidy(gm)
        return PassResult(gm, True, inserted=new_nodes(before, gm), added_inputs=[self.config.input_name])

    @staticmethod
    def _head(graph: fx.Graph) -> fx.Node | None:
        """The LM head behind the logits output; None when there is none to select before."""
        if OUTPUTS_META not in output_node(graph).meta:
            return None
        try:
            return lm_head(graph)
        except SpeccError:
            return None


def _rows_of(spec: TensorSpec) -> TensorSpec:
    if list(spec.shape).count("q") != 1:
        raise SpeccError(f"output {spec.name!r} has shape {spec.shape}; expected one q axis of logits")
    return TensorSpec(spec.name, spec.role, spec.dtype, tuple(LOGIT_ROWS_DIM if d == "q" else d for d in spec.shape))
