"""Attention masks and positions for prefill, chain steps and tree verification."""

from __future__ import annotations

import torch

from specc.runtime.tree import TreeTensors


def causal_chunk_mask(start: int, length: int, device="cpu") -> torch.Tensor:
    """`[1, 1, length, start + length]`: a chunk after `start` cached tokens."""
    rows = torch.arange(length, device=device)[:, None] + start
    cols = torch.arange(start + length, device=device)[None, :]
    return (cols <= rows)[None, None]


def tree_mask(prefix_len: int, tree: TreeTensors) -> torch.Tensor:
    """`[1, 1, n, prefix_len + n]`: the whole prefix plus each node's ancestors."""
    n = tree.ancestor_mask.shape[0]
    mask = torch.ones(n, prefix_len + n, dtype=torch.bool, device=tree.ancestor_mask.device)
    mask[:, prefix_len:] = tree.ancestor_mask
    return mask[None, None]


def apply_sliding_window(mask: torch.Tensor, positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """Hide keys more than `window` positions behind each query (Mistral-style)."""
    if window is None or mask.shape[-1] <= window:
        return mask
    key_positions = torch.arange(mask.shape[-1], device=mask.device)
    too_far = key_positions[None, :] <= positions.reshape(-1, 1) - window
    return mask & ~too_far[None, None]
