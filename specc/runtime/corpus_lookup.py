"""The corpus drafter: n-gram continuations from text the target wrote elsewhere.

The n-gram drafter (`specc.runtime.ngram`) copies from the context, which holds
nothing to copy at the start of a reply or in open-ended chat. What the target
wrote in other conversations (`specc distill-data` output) holds its stock
phrases, list markup and closing formulas. This drafter indexes such a corpus
once: for every suffix of 1 to `max_ngram` tokens that occurred in it, the
token that most often followed. A draft extends the context one token at a
time by the longest indexed suffix of the context and the draft so far, as an
n-gram model would, up to `num_draft_tokens` tokens.

Pure Python over a dictionary, no model calls: its drafts are deterministic,
so the loop's point-mass acceptance keeps sampling lossless, and it may share
a tree with other drafters (`ComposedDrafter`), which ask it among the first.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget
from specc.contract.tree import TreeSpec, tree_tensors
from specc.data.token_corpus import CORPUS_STATE_KEY
from specc.errors import UsageError


def corpus_branch(state: dict, num_draft_tokens: int = 8) -> CorpusDrafter | None:
    """The drafter over the corpus a method's `prepare` kept (`specc.data.token_corpus.corpus_state`);
    None when the engine holds none."""
    sequences = state.get(CORPUS_STATE_KEY)
    return CorpusDrafter(sequences, num_draft_tokens=num_draft_tokens) if sequences else None


class CorpusDrafter:
    # Proposals read only the token list, observe learns nothing, begin reads no prefill, and
    # a draft costs a dictionary lookup per token.
    capabilities = Capabilities(resumable=True, composable=True, draft_cost=0.0)

    def __init__(self, sequences: list[list[int]], max_ngram: int = 4, num_draft_tokens: int = 8):
        if max_ngram < 1 or num_draft_tokens < 1:
            raise UsageError(f"CorpusDrafter needs max_ngram ({max_ngram}) >= 1 and num_draft_tokens "
                             f"({num_draft_tokens}) >= 1")
        self.max_ngram = max_ngram
        self.num_draft_tokens = num_draft_tokens
        self.next_token = most_frequent_followers(sequences, max_ngram)

    def begin(self, prompt, prefill) -> None:
        """Nothing to reset: the index is fixed and every proposal reads the token list."""

    def observe(self, draft, acceptance, verification) -> None:
        """Nothing to learn: the corpus is what the engine was compiled with."""

    def propose(self, tokens: list[int], budget: DraftBudget, sampling, generator) -> Draft | None:
        limit = min(self.num_draft_tokens, budget.max_depth, budget.max_nodes - 1)
        context, chain = list(tokens[-self.max_ngram:]), []
        while len(chain) < limit:
            token = self._follower(context)
            if token is None:
                break
            chain.append(token)
            context = context[1:] + [token] if len(context) == self.max_ngram else context + [token]
        if not chain:
            return None
        # No estimates: a composed drafter ranks this branch by its measured acceptance per depth.
        return Draft(tree=tree_tensors(TreeSpec.chain(len(chain))), node_tokens=torch.tensor([tokens[-1], *chain]))

    def _follower(self, context: list[int]) -> int | None:
        """What most often followed the longest suffix of `context` that the corpus holds."""
        for n in range(len(context), 0, -1):
            token = self.next_token.get(tuple(context[-n:]))
            if token is not None:
                return token
        return None


def most_frequent_followers(sequences: list[list[int]], max_ngram: int) -> dict[tuple[int, ...], int]:
    """Each n-gram (n = 1..max_ngram) of `sequences` -> the token that most often came next
    (the first seen among equals)."""
    counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for sequence in sequences:
        for n in range(1, max_ngram + 1):
            for start in range(len(sequence) - n):
                counts[tuple(sequence[start:start + n])][sequence[start + n]] += 1
    return {key: followers.most_common(1)[0][0] for key, followers in counts.items()}
