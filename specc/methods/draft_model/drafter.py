"""`draft-model`'s drafter: the draft model with its own KV cache proposes a chain
(or a top-1 chain with its top-k siblings at every depth), stopping early when
its confidence drops below `stop_threshold`.

A reduced draft head (`draft_vocab_size`) returns logits over its rows only;
drafted rows are mapped back to token ids, and a sampled chain's q is spread
over the whole vocabulary with zeros elsewhere, so speculative sampling stays
exact (`specc.runtime.draft_logits`).
"""

from __future__ import annotations

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget, MethodRuntime
from specc.contract.sampling import SamplingConfig
from specc.contract.tree import TreeSpec, tree_tensors
from specc.contract.verification import Acceptance, Verification
from specc.methods.draft_model.config import DraftModelConfig
from specc.runtime.cached_model import CachedModel
from specc.runtime.draft_follower import DraftFollower
from specc.runtime.draft_logits import draft_distribution, full_vocabulary, token_ids, vocabulary_from_state
from specc.runtime.sampling import sample


class DraftModelDrafter:
    # What its model has seen is a DraftFollower's, read from the draft it is shown; after a
    # reused prefix its own KV still holds there.
    capabilities = Capabilities(resumable=True, composable=True)

    def __init__(self, draft: CachedModel, config: DraftModelConfig, vocabulary: torch.Tensor | None = None):
        """`vocabulary`: the token id of each row of a reduced draft head (None: the full head)."""
        self.draft = draft
        self.config = config
        self.vocabulary = vocabulary
        self.vocab_size = draft.architecture.vocab_size
        self.follower = DraftFollower(draft.max_seq_len, draft.device)

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        self.follower.begin(prompt, prefill)

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        width = 1 if budget.chain_only else self.config.tree_width
        max_depth = min(self.config.num_draft_tokens, budget.max_depth, (budget.max_nodes - 1) // width)
        if max_depth < 1:
            return None
        sampled_chain = not sampling.greedy and width == 1
        needs_probs = sampled_chain or self.config.stop_threshold > 0
        start = self.follower.valid
        logits = self.draft.extend(torch.tensor(tokens[start:], device=self.draft.device), start)[-1]
        self.follower.caught_up(len(tokens) - 1)
        node_tokens, draft_probs = [tokens[-1]], []
        for depth in range(1, max_depth + 1):
            probs = draft_distribution(logits, sampling) if needs_probs else None
            if sampled_chain:
                rows = torch.tensor([sample(probs, generator)], device=probs.device)
                draft_probs.append(full_vocabulary(probs, self.vocabulary, self.vocab_size))
            else:
                rows = logits.topk(width).indices
            level_tokens = token_ids(rows, self.vocabulary)
            node_tokens += level_tokens
            if depth == max_depth or (probs is not None and float(probs.max()) < self.config.stop_threshold):
                break
            slot = len(tokens) + depth - 1
            logits = self.draft.extend(torch.tensor(level_tokens[:1], device=self.draft.device), slot)[-1]
            self.follower.fed(level_tokens[0])
        return Draft(
            tree=tree_tensors(TreeSpec((width,) * depth)),
            node_tokens=torch.tensor(node_tokens, device=self.draft.device),
            draft_probs=torch.stack(draft_probs) if sampled_chain else None,
        )

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        self.follower.observe(draft, acceptance, verification)


def build_runtime(context, config: DraftModelConfig) -> MethodRuntime:
    draft = context.model("draft")
    return MethodRuntime(context.model("target"),
                         DraftModelDrafter(draft, config, vocabulary_from_state(context.state, draft.device)))
