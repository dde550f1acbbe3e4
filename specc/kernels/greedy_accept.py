"""Triton kernels: greedy acceptance of a drafted token tree, on the device.

Two launches, no host synchronisation between them:
1. `_row_argmax_kernel`, one program per node: the argmax of its logits row,
   blocked over the vocabulary; ties go to the lowest index, as
   `torch.argmax` does.
2. `_walk_tree_kernel`, one program: scan the nodes in order, accepting a
   node when its parent is the last accepted node and its token is that
   node's argmax. Parents come before children, so the scan meets the first
   matching child of the current node before any of its descendants.

The path buffer is filled with -1 before the walk writes the accepted
nodes. The parent order (`0 <= parent < node`) is the caller's contract:
checking it would read the parents back to the host.

Imports triton: load it through `specc.kernels.dispatch`, never directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.kernels.reference import check_greedy_accept_inputs

INTERPRETED = triton.knobs.runtime.interpret   # what @triton.jit saw when it decorated the kernels below
BLOCK_VOCAB = 1024


@triton.jit
def _row_argmax_kernel(logits, best, vocab, stride_row, stride_col, BLOCK_VOCAB: tl.constexpr):
    row = tl.program_id(0)
    best_value = tl.full([], float("-inf"), tl.float32)
    best_index = tl.zeros([], tl.int64)
    for start in range(0, vocab, BLOCK_VOCAB):
        cols = start + tl.arange(0, BLOCK_VOCAB)
        values = tl.load(logits + row * stride_row + cols * stride_col, mask=cols < vocab,
                         other=float("-inf")).to(tl.float32)
        block_max = tl.max(values, 0)
        block_index = tl.argmax(values, 0, tie_break_left=True).to(tl.int64) + start
        better = block_max > best_value   # strictly: an equal later block keeps the earlier index
        best_index = tl.where(better, block_index, best_index)
        best_value = tl.where(better, block_max, best_value)
    tl.store(best + row, best_index)


@triton.jit
def _walk_tree_kernel(best, node_tokens, parents, path, bonus, nodes):
    current = tl.zeros([], tl.int64)
    accepted = tl.full([], 1, tl.int64)
    for node in range(1, nodes):
        node_index = tl.zeros([], tl.int64) + node
        hit = (tl.load(parents + node) == current) & (tl.load(node_tokens + node) == tl.load(best + current))
        tl.store(path + accepted, node_index, mask=hit)
        accepted = tl.where(hit, accepted + 1, accepted)
        current = tl.where(hit, node_index, current)
    tl.store(path, 0)
    tl.store(bonus, tl.load(best + current))


def greedy_accept(logits: torch.Tensor, node_tokens: torch.Tensor,
                  parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch both kernels; same contract as `specc.kernels.reference.greedy_accept`."""
    check_greedy_accept_inputs(logits, node_tokens, parents)
    nodes, vocab = logits.shape
    best = torch.empty(nodes, dtype=torch.int64, device=logits.device)
    path = torch.full((nodes,), -1, dtype=torch.int64, device=logits.device)
    bonus = torch.empty((), dtype=torch.int64, device=logits.device)
    _row_argmax_kernel[(nodes,)](logits, best, vocab, *logits.stride(),
                                 BLOCK_VOCAB=min(BLOCK_VOCAB, triton.next_power_of_2(vocab)))
    _walk_tree_kernel[(1,)](best, node_tokens.contiguous(), parents.contiguous(), path, bonus, nodes)
    return path, bonus
