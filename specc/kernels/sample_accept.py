"""Triton kernel: speculative-sampling acceptance of a drafted chain or tree, on the device.

One program, no host synchronisation. The caller draws the uniforms (one per
node's test, then one for the final token), so the kernel is deterministic
given them and can be compared draw for draw with
`specc.kernels.reference.sample_accept`, which states the rule.

1. The walk scans the nodes in order (parents come before their children, so
   a node's children are met after it, in order). A node whose parent is the
   current node is tested: chain (`CHAIN`, with the draft's q): accept when
   `u < min(1, p(x) / q(x))`; tree of point-mass candidates: accept when
   `u < p(x) / (1 - removed)`, `removed` the target mass of the tokens of
   the current node's siblings rejected before it (a token already rejected
   has chance 0). An accepted node becomes the current node.
2. The final token is drawn from the current node's row of p by inverse CDF
   over vocabulary blocks: the residual `max(p - q, 0)` (chain) or p without
   the rejected children's tokens (tree) when the current node had children,
   p itself when it had none or the residual is empty.

Imports triton: load it through `specc.kernels.dispatch`, never directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.kernels.reference import check_sample_accept_inputs

INTERPRETED = triton.knobs.runtime.interpret   # what @triton.jit saw when it decorated the kernel below
BLOCK_VOCAB = 1024
TREE_BLOCK_VOCAB = 256   # a tree compares each block with the children's tokens: [block, nodes] at once


@triton.jit
def _target_and_residual(row, draft_row, cols, vocab, had_children, all_tokens, is_child, CHAIN: tl.constexpr):
    """One vocabulary block of the target's probabilities at the stopping node, and what is left
    to sample from there: max(p - q, 0) for a chain, p without the rejected children's tokens
    for a tree of point-mass candidates."""
    p = tl.load(row + cols, mask=cols < vocab, other=0.0)
    if CHAIN:
        q = tl.load(draft_row + cols, mask=(cols < vocab) & had_children, other=0.0)
        residual = tl.maximum(p - q, 0.0)
    else:
        gone = tl.sum(((cols[:, None] == all_tokens[None, :]) & is_child[None, :]).to(tl.int32), 1) > 0
        residual = tl.where(gone, 0.0, p)
    return p, residual


@triton.jit
def _sample_accept_kernel(probs, drafts, node_tokens, parents, uniforms, path, token_out, nodes, vocab,
                          stride_p, stride_d, CHAIN: tl.constexpr, BLOCK_NODES: tl.constexpr,
                          BLOCK_VOCAB: tl.constexpr):
    ks = tl.arange(0, BLOCK_NODES)
    k_ok = (ks >= 1) & (ks < nodes)
    all_parents = tl.load(parents + ks, mask=k_ok, other=-1)
    all_tokens = tl.load(node_tokens + ks, mask=k_ok, other=-1)
    current = tl.zeros([], tl.int64)
    accepted = tl.full([], 1, tl.int64)
    removed = tl.zeros([], tl.float32)
    for node in range(1, nodes):
        node_index = tl.zeros([], tl.int64) + node
        parent = tl.load(parents + node)
        token = tl.load(node_tokens + node)
        p = tl.load(probs + current * stride_p + token)
        if CHAIN:
            q = tl.load(drafts + current * stride_d + token)
            chance = tl.minimum(p / tl.maximum(q, 1e-20), 1.0)
        else:
            # earlier children of the current node were all rejected (else it would have moved on)
            seen = tl.sum(((ks < node) & k_ok & (all_parents == current) & (all_tokens == token)).to(tl.int32), 0)
            left = 1.0 - removed
            chance = tl.where((seen == 0) & (left > 0.0), p / tl.where(left > 0.0, left, 1.0), 0.0)
        tested = parent == current
        hit = tested & (tl.load(uniforms + node) < chance)
        tl.store(path + accepted, node_index, mask=hit)
        if not CHAIN:
            removed = tl.where(hit, 0.0, tl.where(tested & (chance > 0.0), removed + p, removed))
        accepted = tl.where(hit, accepted + 1, accepted)
        current = tl.where(hit, node_index, current)
    tl.store(path, 0)

    is_child = k_ok & (all_parents == current)
    had_children = tl.sum(is_child.to(tl.int32), 0) > 0
    row = probs + current * stride_p
    draft_row = drafts + current * stride_d
    residual_total = tl.zeros([], tl.float32)
    plain_total = tl.zeros([], tl.float32)
    for start in range(0, vocab, BLOCK_VOCAB):
        cols = start + tl.arange(0, BLOCK_VOCAB)
        p, residual = _target_and_residual(row, draft_row, cols, vocab, had_children, all_tokens, is_child, CHAIN)
        plain_total += tl.sum(p, 0)
        residual_total += tl.sum(residual, 0)
    plain = residual_total <= 0.0
    target = tl.load(uniforms + nodes) * tl.where(plain, plain_total, residual_total)
    running = tl.zeros([], tl.float32)
    found = tl.full([], -1, tl.int64)
    last_positive = tl.full([], -1, tl.int64)
    for start in range(0, vocab, BLOCK_VOCAB):
        cols = start + tl.arange(0, BLOCK_VOCAB)
        p, residual = _target_and_residual(row, draft_row, cols, vocab, had_children, all_tokens, is_child, CHAIN)
        weights = tl.where(plain, p, residual)
        cumulative = tl.cumsum(weights, 0) + running
        first = tl.min(tl.where((cumulative > target) & (cols < vocab), cols, vocab), 0).to(tl.int64)
        found = tl.where((found < 0) & (first < vocab), first, found)
        last_positive = tl.maximum(last_positive, tl.max(tl.where(weights > 0.0, cols, -1), 0).to(tl.int64))
        running += tl.sum(weights, 0)
    tl.store(token_out, tl.where(found >= 0, found, last_positive))


def sample_accept(target_probs: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                  uniforms: torch.Tensor, draft_probs: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel; same contract as `specc.kernels.reference.sample_accept`."""
    check_sample_accept_inputs(target_probs, node_tokens, parents, uniforms, draft_probs)
    nodes, vocab = target_probs.shape
    path = torch.full((nodes,), -1, dtype=torch.int64, device=target_probs.device)
    token = torch.empty((), dtype=torch.int64, device=target_probs.device)
    probs = target_probs.contiguous()
    chain = draft_probs is not None
    drafts = draft_probs.contiguous() if chain and draft_probs.numel() else probs   # never read without CHAIN
    _sample_accept_kernel[(1,)](probs, drafts, node_tokens.contiguous(), parents.contiguous(), uniforms.contiguous(),
                                path, token, nodes, vocab, probs.stride(0), drafts.stride(0), CHAIN=chain,
                                BLOCK_NODES=max(16, triton.next_power_of_2(nodes)),
                                BLOCK_VOCAB=min(BLOCK_VOCAB if chain else TREE_BLOCK_VOCAB,
                                                triton.next_power_of_2(vocab)))
    return path, token
