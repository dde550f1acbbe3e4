"""S3D's drafter: one forward of the `draft` graph over the root and γ-1 mask
tokens proposes the next γ tokens at once.

The draft graph shares the target's KV cache. It reads the committed
prefix's full-model K/V and writes its kept layers' K/V for the γ rows at
slots p..p+γ-1 (the root's slot and the ones after it). Verification
writes every tree slot, p included, with the full model before anything
reads it, so no draft K/V outlives the round; skipped layers write nothing.
"""

from __future__ import annotations

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget
from specc.contract.sampling import SamplingConfig
from specc.contract.verification import Acceptance, Verification
from specc.methods.s3d.config import S3DConfig
from specc.runtime.cached_model import CachedModel
from specc.runtime.masks import causal_chunk_mask
from specc.runtime.per_depth_drafts import sampled_chain, top_k_fan
from specc.runtime.sampling import probabilities


class MaskTokenDrafter:
    capabilities = Capabilities(resumable=True)   # it keeps nothing per sequence: it reads the target's KV

    def __init__(self, draft: CachedModel, config: S3DConfig):
        self.draft = draft
        self.config = config
        self._eos = set(draft.architecture.eos_token_ids)

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        """Nothing per sequence: the draft reads the target's committed KV."""

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        """Nothing to catch up on: the next draft forward starts from the committed prefix."""

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        depth = min(self.config.draft_tokens, budget.max_depth, budget.max_nodes - 1)
        if depth < 1:
            return None
        logits = self.predict(tokens[-1], len(tokens) - 1, depth)
        if not sampling.greedy and (self.config.tree_width == 1 or budget.chain_only):
            return self._sampled_chain(tokens[-1], logits, sampling, generator)
        return self._top_k_tree(tokens[-1], logits, budget.max_nodes, sampling, budget.chain_only)

    def predict(self, root_token: int, root: int, depth: int) -> torch.Tensor:
        """Logits [depth, vocab] for the `depth` tokens after the root at slot `root`:
        one draft forward over [root, <M> × (depth - 1)] at slots root..root+depth-1."""
        device = self.draft.device
        tokens = torch.zeros(depth, dtype=torch.long, device=device)
        tokens[0] = root_token
        is_mask = torch.ones(1, depth, dtype=torch.bool, device=device)
        is_mask[0, 0] = False
        slots = torch.arange(root, root + depth, device=device)
        (logits,) = self.draft.run_all(tokens, slots, slots, causal_chunk_mask(root, depth, device), is_mask)
        return logits[0]

    def _sampled_chain(self, root_token: int, logits: torch.Tensor, sampling: SamplingConfig,
                       generator: torch.Generator | None) -> Draft:
        return sampled_chain(root_token, probabilities(logits, sampling), self._eos, generator)

    def _top_k_tree(self, root_token: int, logits: torch.Tensor, max_nodes: int, sampling: SamplingConfig,
                    chain_only: bool = False) -> Draft:
        """The top-1 chain, with the top-k at depths whose top-1 probability is below
        `tree_threshold` (unless `chain_only`); the chain stops after an end-of-sequence token."""
        probs = torch.softmax(logits.float(), dim=-1) if sampling.greedy else probabilities(logits, sampling)
        wide = 1 if chain_only else self.config.tree_width
        widths = [1 if float(q.max()) >= self.config.tree_threshold else wide for q in probs]
        return top_k_fan(root_token, probs, widths, max_nodes, self._eos)
