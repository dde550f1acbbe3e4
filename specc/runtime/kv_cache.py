"""Preallocated per-layer KV caches and the one operation on them: commit."""

from __future__ import annotations

import torch

from specc.host.huge_pages import on_huge_pages


class KVCache:
    """`[1, kv_heads, slots, head_dim]` keys and values for each layer.

    One slot more than the longest sequence is allocated so that the
    attention's read view is always a proper slice of the cache, which
    keeps the exported graph's shape guards satisfiable at full length.
    """

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, max_seq_len: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (1, kv_heads, max_seq_len + 1, head_dim)
        self.max_seq_len = max_seq_len
        zeros = {i: torch.zeros(shape, dtype=dtype, device=device) for i in range(2 * num_layers)}
        self.tensors = list(on_huge_pages(zeros).values())   # a step reads every layer's keys and values

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        """Move the accepted tree rows (at base + offset) to base + 0, 1, 2, …

        Rows already in place are left alone; a chain never moves anything.
        """
        moves = [(i, off) for i, off in enumerate(accepted_offsets) if off != i]
        if not moves:
            return
        device = self.tensors[0].device
        dst = torch.tensor([base + i for i, _ in moves], device=device)
        src = torch.tensor([base + off for _, off in moves], device=device)
        for cache in self.tensors:
            cache.index_copy_(2, dst, cache.index_select(2, src))
