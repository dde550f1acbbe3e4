"""What one target forward returns to the loop and to the drafter."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Verification:
    """Logits `[q, vocab]` of the rows just run (None for a graph without a
    head), and the graph's other declared outputs by name, each with the batch
    dimension dropped (a layer's hidden states `[q, hidden]`, logits of extra
    positions, ...)."""

    logits: torch.Tensor | None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    slots: torch.Tensor | None = None    # the cache slot of each row
