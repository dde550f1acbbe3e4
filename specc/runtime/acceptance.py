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

Logits or probabilities on a CUDA device (with triton installed) are accepted
there, by `torch.ops.specc.greedy_accept` / `sample_accept` (the walk and the
draw on the device; the path, its tokens and the next token come back in one
transfer, the round's one host sync). Elsewhere the host walks, as before;
`on_device=True` forces the ops anywhere (how they are tested on the CPU).
"""

from __future__ import annotations

import logging
from functools import lru_cache

import torch

from specc.contract.tree import TreeTensors
from specc.contract.verification import Acceptance
from specc.kernels.dispatch import triton_installed
from specc.kernels.row_argmax import greedy_tokens
from specc.runtime.sampling import sample

log = logging.getLogger("specc")


def accept_greedy(node_tokens: torch.Tensor, target_logits: torch.Tensor, tree: TreeTensors,
                  on_device: bool | None = None) -> Acceptance:
    """`node_tokens[i]` is node i's token; `target_logits[i]` the target's
    prediction after node i. `on_device`: None decides by the logits (CUDA with
    triton: the greedy_accept op), True forces the op wherever the logits are (on
    the CPU it runs the reference, or the interpreted kernel under
    TRITON_INTERPRET=1: how the op path is tested), False keeps the host walk."""
    if _use_op(on_device, target_logits):
        return _or_host(on_device, lambda: _accept_greedy_on_device(node_tokens, target_logits, tree),
                        lambda: accept_greedy(node_tokens, target_logits, tree, on_device=False))
    best = greedy_tokens(target_logits).tolist()
    tokens = node_tokens.tolist()
    path, node = [0], 0
    while True:
        match = next((c for c in tree.children(node) if tokens[c] == best[node]), None)
        if match is None:
            return Acceptance(path, best[node])
        path.append(match)
        node = match


def _use_op(on_device: bool | None, scores: torch.Tensor) -> bool:
    if on_device is None:
        return scores.is_cuda and triton_installed() and not _OP_FAILED
    return on_device


# Set when an op fails on its own (a Triton build or launch error on an untried GPU): the
# automatic choice keeps the host walk from then on, with one warning, so generation goes on.
_OP_FAILED: list[str] = []


def _or_host(on_device: bool | None, device_walk, host_walk) -> Acceptance:
    if on_device is not None:
        return device_walk()
    try:
        return device_walk()
    except Exception as exc:   # noqa: BLE001 - any failure of the op: the host walk is always right
        _OP_FAILED.append(f"{type(exc).__name__}: {exc}")
        log.warning("specc's acceptance op failed (%s); accepting on the host from now on",
                    _OP_FAILED[-1].splitlines()[0])
        return host_walk()


def _accept_greedy_on_device(node_tokens: torch.Tensor, target_logits: torch.Tensor,
                             tree: TreeTensors) -> Acceptance:
    """The same walk as the host's (the first matching child, in node order: children come
    after their parent), by the op; the path, its tokens and the bonus come back in one transfer."""
    device = target_logits.device
    nodes = len(tree.parent)
    tokens = node_tokens.to(device=device, dtype=torch.int64)
    path, bonus = torch.ops.specc.greedy_accept(target_logits[:nodes], tokens, _parents_on(tree.parent, device))
    return _fetched(path, bonus, tokens)


def _fetched(path: torch.Tensor, next_token: torch.Tensor, tokens: torch.Tensor) -> Acceptance:
    """An op's padded path and token, with the tokens along the path, in one transfer: the
    round's one host sync."""
    nodes = path.shape[0]
    both = torch.cat([path, tokens[path.clamp(min=0)], next_token.reshape(1)]).tolist()
    accepted = [node for node in both[:nodes] if node >= 0]
    return Acceptance(accepted, both[-1], both[nodes + 1:nodes + len(accepted)])


def _uniforms(count: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """The op's draws; a seeded (CPU) generator draws on the CPU, as `sampling.sample` does."""
    if generator is not None and generator.device != device:
        return torch.rand(count, generator=generator).to(device)
    return torch.rand(count, generator=generator, device=device)


def _sample_on_device(node_tokens: torch.Tensor, target_probs: torch.Tensor, parents: tuple[int, ...],
                      generator: torch.Generator | None, draft_probs: torch.Tensor | None) -> Acceptance:
    device, nodes = target_probs.device, len(parents)
    tokens = node_tokens.to(device=device, dtype=torch.int64)
    if draft_probs is not None:
        draft_probs = draft_probs[:nodes - 1].to(device=device, dtype=torch.float32)
    path, token = torch.ops.specc.sample_accept(target_probs[:nodes].float(), tokens, _parents_on(parents, device),
                                                _uniforms(nodes + 1, generator, device), draft_probs)
    return _fetched(path, token, tokens)


@lru_cache(maxsize=64)
def _parents_on(parents: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The tree's parents as an int64 tensor on `device`, copied there once per tree shape."""
    return torch.tensor(parents, dtype=torch.int64, device=device)


def accept_sampled_chain(node_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                         generator: torch.Generator | None, on_device: bool | None = None) -> Acceptance:
    """Chain drafted by sampling: `draft_probs[d]` is q for depth d+1. `on_device` as in
    `accept_greedy` (the sample_accept op; same distribution, other random draws)."""
    if _use_op(on_device, target_probs):
        chain = tuple(range(-1, node_tokens.numel() - 1))
        return _or_host(on_device, lambda: _sample_on_device(node_tokens, target_probs, chain, generator, draft_probs),
                        lambda: accept_sampled_chain(node_tokens, draft_probs, target_probs, generator, False))
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
                        generator: torch.Generator | None, on_device: bool | None = None) -> Acceptance:
    """Tree of deterministic candidates, point-mass rejection per sibling. `on_device` as in
    `accept_greedy` (the sample_accept op; same distribution, other random draws)."""
    if _use_op(on_device, target_probs):
        return _or_host(on_device, lambda: _sample_on_device(node_tokens, target_probs, tree.parent, generator, None),
                        lambda: accept_sampled_tree(node_tokens, target_probs, tree, generator, False))
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
