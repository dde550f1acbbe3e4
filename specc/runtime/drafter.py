"""What a method's drafter must provide to the loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specc.runtime.acceptance import Acceptance
from specc.runtime.sampling import SamplingConfig
from specc.runtime.tree import TreeTensors


@dataclass
class Draft:
    tree: TreeTensors
    node_tokens: torch.Tensor            # [n]: the root's token, then each node's
    draft_probs: torch.Tensor | None = None  # [depth, vocab] q per depth, for a sampled chain

    @property
    def sampled_chain(self) -> bool:
        return self.draft_probs is not None


@dataclass(frozen=True)
class DraftBudget:
    """How much a draft may hold this round, from max tokens and max length."""

    max_depth: int
    max_nodes: int


class Drafter(Protocol):
    def begin(self, prompt: torch.Tensor) -> None:
        """Start a new sequence (reset any per-sequence state)."""

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        """Draft after `tokens` (whose last one is the root); None drafts nothing."""

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        """Learn which part of the draft the target accepted."""
