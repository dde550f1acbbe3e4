"""Attention masks and positions for prefill, chain steps and tree verification."""

from __future__ import annotations

import torch

from specc.contract.tree import TreeTensors


def causal_chunk_mask(start: int, length: int, device="cpu", keys: int | None = None) -> torch.Tensor:
    """`[1, 1, length, keys]`: a chunk after `start` cached tokens, over `keys` columns
    (default `start + length`; more are hidden: `pad_keys`'s mask, made in one step)."""
    rows = torch.arange(start, start + length, device=device)[:, None]
    cols = torch.arange(start + length if keys is None else keys, device=device)[None, :]
    return (cols <= rows)[None, None]


def tree_mask(prefix_len: int, tree: TreeTensors) -> torch.Tensor:
    """`[1, 1, n, prefix_len + n]`: the whole prefix plus each node's ancestors."""
    n = tree.ancestor_mask.shape[0]
    mask = torch.ones(n, prefix_len + n, dtype=torch.bool, device=tree.ancestor_mask.device)
    mask[:, prefix_len:] = tree.ancestor_mask
    return mask[None, None]


KEY_BLOCK = 64   # attention masks are padded to a multiple of this many keys


def pad_keys(mask: torch.Tensor, max_keys: int) -> torch.Tensor:
    """`mask` with hidden key columns appended up to a multiple of `KEY_BLOCK` (at most `max_keys`).

    Why: the graph attends over as many cache slots as the mask has columns, and
    the reductions over that axis (softmax, probabilities times values) group
    their terms by its length. A one-row step after p tokens and a verification
    of q rows after the same p tokens then summed a row's terms in different
    orders: in bfloat16 that moved logits enough to flip the frequent near-ties,
    so lossless engines differed from `none` (measured:
    docs/backends.md#measurements-behind-the-lowering-choices). Padded,
    both see the same length unless a block boundary lies between p + 1 and
    p + q, and the extra columns are exact zeros after the softmax."""
    keys = mask.shape[-1]
    padded = padded_key_count(keys, max_keys)
    if padded <= keys:
        return mask
    hidden_value = False if mask.dtype == torch.bool else float("-inf")   # boolean or additive masks
    hidden = torch.full((*mask.shape[:-1], padded - keys), hidden_value, dtype=mask.dtype, device=mask.device)
    return torch.cat([mask, hidden], dim=-1)


def rows_in_key_block(prefix_len: int, max_keys: int) -> int:
    """How many rows a call after `prefix_len` cached tokens may have so that its padded
    key count (`pad_keys`) is the one a one-row step at each of its rows would see:
    the rows must end inside the key block the first row ends in (or the padding has
    reached `max_keys`, the same for every call)."""
    return padded_key_count(prefix_len + 1, max_keys) - prefix_len


def padded_key_count(keys: int, max_keys: int) -> int:
    """`keys` rounded up to a multiple of `KEY_BLOCK`, at most `max_keys`."""
    return min(max_keys, -(-keys // KEY_BLOCK) * KEY_BLOCK)


def apply_sliding_window(mask: torch.Tensor, positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """Hide keys more than `window` positions behind each query (Mistral-style)."""
    if window is None or mask.shape[-1] <= window:
        return mask
    key_positions = torch.arange(mask.shape[-1], device=mask.device)
    too_far = key_positions[None, :] <= positions.reshape(-1, 1) - window
    return mask & ~too_far[None, None]
