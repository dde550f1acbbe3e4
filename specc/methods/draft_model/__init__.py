"""Method `draft-model`: classic speculative decoding with a small HF draft model.

The draft model is captured and rewritten with the same infrastructure
passes as the target and keeps its own KV cache. It drafts a chain (or a
caterpillar tree with its top-k at each depth); the target verifies the
flattened tree in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specc.errors import UsageError
from specc.methods.config import MethodConfig, option
from specc.methods.descriptor import TARGET, ExtraSource, GraphRecipe, MethodDescriptor
from specc.methods.infrastructure import infrastructure_passes
from specc.runtime.acceptance import Acceptance
from specc.runtime.cached_model import CachedModel
from specc.runtime.drafter import Draft, DraftBudget, MethodRuntime
from specc.runtime.verification import Verification
from specc.runtime.sampling import SamplingConfig, probabilities, sample
from specc.runtime.tree import TreeSpec, tree_tensors


@dataclass(frozen=True)
class DraftModelConfig(MethodConfig):
    draft_model: str | None = option(None, "draft checkpoint directory (same tokenizer as the target); "
                                           "required")
    num_draft_tokens: int = option(4, "draft depth per round (gamma)")
    tree_width: int = option(1, "candidates per depth: 1 drafts a chain; k > 1 adds the draft's top-k "
                                "siblings at every depth (a top-1 chain with sibling fans)")

    def __post_init__(self):
        if not 1 <= self.num_draft_tokens <= 64:
            raise UsageError(f"num_draft_tokens={self.num_draft_tokens} must be between 1 and 64")
        if not 1 <= self.tree_width <= 32:
            raise UsageError(f"tree_width={self.tree_width} must be between 1 and 32")


class DraftModelDrafter:
    def __init__(self, draft: CachedModel, config: DraftModelConfig):
        self.draft = draft
        self.config = config
        self.cached_len = 0       # tokens whose draft KV is valid
        self._proposal_base = 0   # len(tokens) when the last draft was proposed
        self._fed_chain = 0       # chain tokens fed back into the draft model

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        self.cached_len = 0

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        width = self.config.tree_width
        depth = min(self.config.num_draft_tokens, budget.max_depth, (budget.max_nodes - 1) // width)
        if depth < 1:
            return None
        sampled_chain = not sampling.greedy and width == 1
        pending = torch.tensor(tokens[self.cached_len:], device=self.draft.device)
        logits = self.draft.extend(pending, self.cached_len)[-1]
        node_tokens, draft_probs = [tokens[-1]], []
        for level in range(depth):
            if sampled_chain:
                q = probabilities(logits, sampling)
                level_tokens = [sample(q, generator)]
                draft_probs.append(q)
            else:
                level_tokens = logits.topk(width).indices.tolist()
            node_tokens += level_tokens
            if level < depth - 1:
                slot = len(tokens) + level
                logits = self.draft.extend(torch.tensor(level_tokens[:1], device=self.draft.device), slot)[-1]
        self._proposal_base, self._fed_chain = len(tokens), depth - 1
        return Draft(
            tree=tree_tensors(TreeSpec((width,) * depth)),
            node_tokens=torch.tensor(node_tokens, device=self.draft.device),
            draft_probs=torch.stack(draft_probs) if sampled_chain else None,
        )

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        if draft is None:
            return   # a plain step: the next proposal feeds the new tokens from cached_len
        chain_accepted = 0
        for node, chain_node in zip(acceptance.path[1:], draft.tree.chain_nodes):
            if node != chain_node:
                break
            chain_accepted += 1
        self.cached_len = self._proposal_base + min(chain_accepted, self._fed_chain)


def _build_runtime(context, config: DraftModelConfig) -> MethodRuntime:
    return MethodRuntime(context.model("target"), DraftModelDrafter(context.model("draft"), config))


METHOD = MethodDescriptor(
    name="draft-model",
    summary="speculative decoding with a separate small Hugging Face draft model (chain or top-k tree); "
            "pass it with --set draft_model=DIR",
    config_class=DraftModelConfig,
    graphs=lambda config: {
        "target": GraphRecipe(TARGET, lambda c: infrastructure_passes()),
        "draft": GraphRecipe("draft", lambda c: infrastructure_passes()),
    },
    build_runtime=_build_runtime,
    extra_sources=(ExtraSource("draft", "draft_model"),),
)
