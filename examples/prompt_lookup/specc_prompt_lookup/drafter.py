"""The n-gram drafter: pure Python over the token list, no model calls."""

from __future__ import annotations

from collections import Counter

import torch

from specc.extension import Draft, DraftBudget, TreeSpec, tree_tensors


class NgramDrafter:
    def __init__(self, config):
        self.config = config

    def begin(self, prompt, prefill) -> None:
        """Nothing to reset: every proposal reads the whole token list."""

    def observe(self, draft, acceptance, verification) -> None:
        """Nothing to learn: accepted tokens join the list the next lookup reads."""

    def propose(self, tokens: list[int], budget: DraftBudget, sampling, generator) -> Draft | None:
        depth_limit = min(self.config.num_draft_tokens, budget.max_depth)
        chain = continuation(tokens, self.config.max_ngram, self.config.min_ngram, depth_limit)
        if not chain:
            return None
        levels = [[token] for token in chain]
        if self.config.tree_width > 1 and not budget.chain_only:
            levels = self._with_siblings(tokens, chain)
        levels = _fit(levels, budget.max_nodes - 1)
        if not levels:
            return None
        nodes = [tokens[-1]] + [token for level in levels for token in level]
        return Draft(tree=tree_tensors(TreeSpec(tuple(map(len, levels)))), node_tokens=torch.tensor(nodes))

    def _with_siblings(self, tokens: list[int], chain: list[int]) -> list[list[int]]:
        """At each depth: the chain token, then other tokens that followed the same
        suffix (the context plus the chain so far), most frequent first."""
        levels = []
        for depth, token in enumerate(chain):
            context = tokens + chain[:depth]
            seen = followers(context, self.config.max_ngram, self.config.min_ngram)
            others = [t for t, _ in seen.most_common() if t != token][: self.config.tree_width - 1]
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
