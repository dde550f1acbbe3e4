"""`kv_policy=finish`: an exited token's remaining layers run later, as extra rows
beside the next token that goes deeper, so every K/V a token reads is the dense model's.

A token that exits at layer e holds exact K/V at layers 0..e and none above.
A later token reads a layer's K/V only when it runs that layer, so the exited
token waits (pending, with the state leaving layer e) and joins the first
later step that reaches layer e+1 as one more row. Causally before the new
token, it writes its exact K/V at each layer in the same segment call that
reads it. Rows still unfinished when that step exits stay pending from the
new exit layer. So every step computes what the dense model computes up to
its exit layer, and the extra rows are cheap while decoding is memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specc.methods.specee.layerwise import LayerwiseForward, LayerwiseResult


@dataclass
class PendingRow:
    slot: int
    token: int
    hidden: torch.Tensor   # [hidden]: the residual stream entering layer `resume`
    resume: int            # the first layer this token has not run


Decide = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor | None]


@dataclass
class _Forward:
    """One layer-stepped forward: its rows so far (slot order), the pending rows yet to join."""
    active: list[PendingRow]
    waiting: list[PendingRow]
    hidden: torch.Tensor | None = None   # [1, rows, hidden] entering the next layer
    env: dict | None = None
    inputs: tuple | None = None


class FinishingRows:
    """Steps tokens through a layer-wise target, finishing earlier exits' layers beside them."""

    def __init__(self, layerwise: LayerwiseForward, cache_tensors: tuple, device):
        self.layerwise = layerwise
        self.cache_tensors = cache_tensors
        self.device = device
        self.pending: list[PendingRow] = []
        self.finished_row_layers = 0   # layers run for pending rows, beside later tokens

    def reset(self) -> None:
        self.pending = []

    def step(self, token: int, slot: int, candidates: torch.Tensor, decide: Decide) -> LayerwiseResult:
        """One token at `slot` ([1, K] `candidates`); `decide(layer, score, hidden)` sees its row only."""
        top = self.layerwise.num_layers - 1
        run = _Forward([PendingRow(slot, token, None, 0)], sorted(self.pending, key=lambda r: r.slot))
        run.env, run.inputs = self._begin(run.active, candidates)
        for layer in range(top + 1):
            self._admit(run, layer, candidates)
            run.hidden, score = self.layerwise.layer(run.env, layer, run.hidden)
            self.finished_row_layers += len(run.active) - 1
            if layer == top or score is None:
                continue
            logits = decide(layer, score[:, -1:], run.hidden[:, -1:])
            if logits is not None:
                self.pending = run.waiting + [PendingRow(r.slot, r.token, run.hidden[0, k], layer + 1)
                                              for k, r in enumerate(run.active)]
                return LayerwiseResult(logits, layer, run.hidden[:, -1:])
        self.pending = []
        return LayerwiseResult(self.layerwise.head(run.hidden[:, -1:], run.inputs), top, run.hidden[:, -1:])

    def finish(self, candidates: torch.Tensor) -> None:
        """Run every pending row through its remaining layers now (before a full-model chunk)."""
        if not self.pending:
            return
        run = _Forward([], sorted(self.pending, key=lambda r: r.slot))
        for layer in range(min(r.resume for r in run.waiting), self.layerwise.num_layers):
            self._admit(run, layer, candidates)
            run.hidden, _ = self.layerwise.layer(run.env, layer, run.hidden)
        self.pending = []

    def _admit(self, run: _Forward, layer: int, candidates: torch.Tensor) -> None:
        """Pending rows whose first missing layer is `layer` join the forward there."""
        joining = [r for r in run.waiting if r.resume == layer]
        if joining:
            run.waiting = [r for r in run.waiting if r.resume != layer]
            run.active, run.hidden = _join(run.active, run.hidden, joining)
            run.env, run.inputs = self._begin(run.active, candidates)

    def _begin(self, rows: list[PendingRow], candidates: torch.Tensor) -> tuple[dict, tuple]:
        """The prologue on `rows` (in slot order): each attends to every slot up to its own."""
        slots = torch.tensor([r.slot for r in rows], device=self.device)
        tokens = torch.tensor([r.token for r in rows], device=self.device)
        width = rows[-1].slot + 1
        mask = torch.arange(width, device=self.device)[None, :] <= slots[:, None]
        inputs = (tokens[None], slots[None], mask[None, None], slots, *self.cache_tensors,
                  candidates.expand(len(rows), -1).contiguous())
        return self.layerwise.begin(inputs), inputs


def _join(active: list[PendingRow], hidden: torch.Tensor | None,
          joining: list[PendingRow]) -> tuple[list[PendingRow], torch.Tensor]:
    """The rows in slot order with `joining` added, and their states entering the next layer."""
    states = {r.slot: r.hidden for r in joining}
    if hidden is not None:
        states.update({r.slot: hidden[0, k] for k, r in enumerate(active)})
    rows = sorted(active + joining, key=lambda r: r.slot)
    return rows, torch.stack([states[r.slot] for r in rows])[None]
