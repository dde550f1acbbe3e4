"""The n-gram drafter: pure Python over the token list, no model calls.

It drafts the continuation of the latest earlier occurrence of the longest
suffix of the tokens that occurred before (Saxena 2023's lookup decoding);
with `tree_width` > 1 each depth also offers the other tokens that followed
the same suffix, most frequent first. Its drafts are
deterministic, so the loop's point-mass acceptance keeps any sampling
lossless. A method may draft with it alone (an example plugin does); a
composed drafter (`specc.runtime.compose`) can run it beside a model's.
"""

from __future__ import annotations

from collections import Counter

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget
from specc.contract.tree import TreeSpec, tree_tensors
from specc.errors import UsageError


class NgramDrafter:
    """Suffixes of `min_ngram` to `max_ngram` tokens are looked up (longest first); at
    most `num_draft_tokens` depths are drafted, with up to `tree_width` candidates each."""

    # Its proposals read only the token list and its observe learns nothing, so it may share
    # a merged draft with other drafters (`ComposedDrafter`) and begin after a reused prefix.
    capabilities = Capabilities(resumable=True, composable=True, draft_cost=0.0)   # pure Python: asked first

    def __init__(self, max_ngram: int, min_ngram: int, num_draft_tokens: int, tree_width: int = 1):
        if not 1 <= min_ngram <= max_ngram or num_draft_tokens < 1 or tree_width < 1:
            raise UsageError(f"NgramDrafter needs 1 <= min_ngram ({min_ngram}) <= max_ngram ({max_ngram}), "
                             f"num_draft_tokens ({num_draft_tokens}) >= 1 and tree_width ({tree_width}) >= 1")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_draft_tokens = num_draft_tokens
        self.tree_width = tree_width

    def begin(self, prompt, prefill) -> None:
        """Nothing to reset: every proposal reads the whole token list."""

    def observe(self, draft, acceptance, verification) -> None:
        """Nothing to learn: accepted tokens join the list the next lookup reads."""

    def propose(self, tokens: list[int], budget: DraftBudget, sampling, generator) -> Draft | None:
        depth_limit = min(self.num_draft_tokens, budget.max_depth)
        chain = continuation(tokens, self.max_ngram, self.min_ngram, depth_limit)
        if not chain:
            return None
        levels = [[token] for token in chain]
        if self.tree_width > 1 and not budget.chain_only:
            levels = self._with_siblings(tokens, chain)
        levels = _fit(levels, budget.max_nodes - 1)
        if not levels:
            return None
        nodes = [tokens[-1]] + [token for level in levels for token in level]
        # A lookup has no probabilities to estimate its nodes' acceptance with.
        return Draft(tree=tree_tensors(TreeSpec(tuple(map(len, levels)))), node_tokens=torch.tensor(nodes),
                     node_scores=None)

    def _with_siblings(self, tokens: list[int], chain: list[int]) -> list[list[int]]:
        """At each depth: the chain token, then other tokens that followed the same
        suffix (the context plus the chain so far), most frequent first."""
        levels = []
        for depth, token in enumerate(chain):
            context = tokens + chain[:depth]
            seen = followers(context, self.max_ngram, self.min_ngram)
            others = [t for t, _ in seen.most_common() if t != token][: self.tree_width - 1]
            levels.append([token, *others])
        return levels


def continuation(tokens: list[int], max_ngram: int, min_ngram: int, limit: int) -> list[int]:
    """What followed the latest earlier occurrence of the longest matching suffix."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start: start + n] == suffix:
                return tokens[start + n: start + n + limit]
    return []


def followers(tokens: list[int], max_ngram: int, min_ngram: int) -> Counter:
    """Tokens that followed any earlier occurrence of the longest suffix that occurred."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        seen = Counter(tokens[start + n] for start in range(len(tokens) - n)
                       if tokens[start: start + n] == suffix)
        if seen:
            return seen
    return Counter()


def _fit(levels: list[list[int]], room: int) -> list[list[int]]:
    """Trim the tree to at most `room` nodes below the root, keeping whole chains first."""
    kept, used = [], 0
    for level in levels:
        if used + 1 > room:
            break
        level = level[: room - used]
        kept.append(level)
        used += len(level)
    return kept
