"""Decide which drafted tokens the target accepts.

Greedy: follow the tree while a child carries the target's argmax; the
bonus token is the argmax where the walk stops.

Sampling keeps the target distribution exactly:
- a chain of tokens sampled from the draft distribution q uses
  Leviathan/Chen speculative sampling (accept with min(1, p/q), else
  resample from the residual max(p - q, 0));
- a tree of deterministic candidates tries the siblings at each depth in
  order, each as a point-mass proposal: accept x with probability p(x),
  else remove x from p and renormalise (the residual), and if every
  sibling is rejected, sample the residual. Each step is an exact
  rejection sampler, so the emitted token has distribution p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specc.runtime.sampling import sample
from specc.runtime.tree import TreeTensors


@dataclass
class Acceptance:
    path: list[int]        # accepted node indices, root (0) first
    next_token: int        # the bonus/corrected token after the path


def accept_greedy(node_tokens: torch.Tensor, target_logits: torch.Tensor, tree: TreeTensors) -> Acceptance:
    """`node_tokens[i]` is node i's token; `target_logits[i]` the target's
    prediction after node i."""
    best = target_logits.argmax(dim=-1).tolist()
    tokens = node_tokens.tolist()
    path, node = [0], 0
    while True:
        match = next((c for c in tree.children(node) if tokens[c] == best[node]), None)
        if match is None:
            return Acceptance(path, best[node])
        path.append(match)
        node = match


def accept_sampled_chain(node_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                         generator: torch.Generator | None) -> Acceptance:
    """Chain drafted by sampling: `draft_probs[d]` is q for depth d+1."""
    tokens = node_tokens.tolist()
    path = [0]
    for depth in range(1, len(tokens)):
        token = tokens[depth]
        p, q = target_probs[depth - 1], draft_probs[depth - 1]
        ratio = float(p[token]) / max(float(q[token]), 1e-20)
        if float(torch.rand((), generator=generator)) < min(1.0, ratio):
            path.append(depth)
            continue
        return Acceptance(path, sample(_residual(p - q, p), generator))
    return Acceptance(path, sample(target_probs[len(tokens) - 1], generator))


def accept_sampled_tree(node_tokens: torch.Tensor, target_probs: torch.Tensor, tree: TreeTensors,
                        generator: torch.Generator | None) -> Acceptance:
    """Tree of deterministic candidates, point-mass rejection per sibling."""
    tokens = node_tokens.tolist()
    path, node = [0], 0
    while True:
        p = target_probs[node].clone()
        accepted = None
        for child in tree.children(node):
            token = tokens[child]
            if float(torch.rand((), generator=generator)) < float(p[token]):
                accepted = child
                break
            p[token] = 0.0
            total = float(p.sum())
            if total <= 0.0:
                break
            p /= total
        if accepted is None:
            return Acceptance(path, sample(p, generator))
        path.append(accepted)
        node = accepted


def _residual(difference: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    residual = difference.clamp(min=0.0)
    total = residual.sum()
    return residual / total if total > 0 else fallback
