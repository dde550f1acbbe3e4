"""Drafts from per-depth distributions: drafters that predict every depth at once
(mask tokens, pseudo hidden states) turn `[depth, vocab]` scores into a draft the
same two ways."""

from __future__ import annotations

import torch

from specc.contract.drafter import Draft
from specc.contract.tree import TreeSpec, tree_tensors
from specc.runtime.sampling import sample


def sampled_chain(root_token: int, probs: torch.Tensor, eos: set[int], generator: torch.Generator | None) -> Draft:
    """Each depth sampled from its own draft distribution q_d (Leviathan acceptance needs
    only the q each token was drawn from); the chain stops after an end-of-sequence token."""
    chain = []
    for q in probs:
        chain.append(sample(q, generator))
        if chain[-1] in eos:
            break
    return Draft(tree=tree_tensors(TreeSpec.chain(len(chain))),
                 node_tokens=torch.tensor([root_token, *chain], device=probs.device),
                 draft_probs=probs[: len(chain)])


def top_k_fan(root_token: int, scores: torch.Tensor, widths: list[int], max_nodes: int, eos: set[int]) -> Draft:
    """The top-w of each depth's scores (w from `widths`), the first continuing the chain
    (a top-1 chain with sibling fans); it stops at `max_nodes` or after an end-of-sequence token."""
    node_tokens, kept = [root_token], []
    for q, width in zip(scores, widths):
        width = min(width, max_nodes - len(node_tokens))
        if width < 1:
            break
        level = q.topk(width).indices.tolist()
        node_tokens += level
        kept.append(width)
        if level[0] in eos:
            break
    return Draft(tree=tree_tensors(TreeSpec(tuple(kept))), node_tokens=torch.tensor(node_tokens, device=scores.device))
