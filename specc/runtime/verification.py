"""What one target forward returns to the loop and to the drafter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specc.runtime.acceptance import Acceptance


@dataclass
class Verification:
    """Logits `[q, vocab]` of the rows just run (None for a graph without a
    head), and the graph's other declared outputs by name, each with the batch
    dimension dropped (a layer's hidden states `[q, hidden]`, logits of extra
    positions, ...)."""

    logits: torch.Tensor | None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    slots: torch.Tensor | None = None    # the cache slot of each row
    # A verifier whose rows are not read from one set of logits (a lossy tree verifier exiting
    # each path at its own layer) decides acceptance itself; the loop then uses this.
    acceptance: Acceptance | None = None
