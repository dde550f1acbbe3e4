"""A compiled graph with its KV cache: the callable the loop steps.

The graph's inputs are, in order: input_ids [1, q], position_ids [1, q],
attn_mask [1, 1, q, kv_len], cache_positions [q], then k/v caches per
layer. Its first output is logits [1, q, vocab].
"""

from __future__ import annotations

from typing import Callable

import torch

from specc.capture.families import ArchitectureSummary
from specc.runtime.kv_cache import KVCache
from specc.runtime.masks import apply_sliding_window, causal_chunk_mask, tree_mask
from specc.runtime.tree import TreeTensors


class CachedModel:
    def __init__(self, forward: Callable, architecture: ArchitectureSummary, max_seq_len: int,
                 dtype: torch.dtype, device="cpu", cache: KVCache | None = None):
        """`cache` lets a draft graph of the target (self-speculation) share the target's KV."""
        self.forward_fn = forward
        self.architecture = architecture
        self.device = device
        self.cache = cache or KVCache(architecture.num_layers, architecture.num_key_value_heads,
                                      architecture.head_dim, max_seq_len, dtype, device)
        self.forward_passes = 0

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            mask: torch.Tensor) -> torch.Tensor:
        """Logits `[q, vocab]` for `tokens` written at cache `slots`."""
        return self.run_all(tokens, positions, slots, mask)[0][0]

    def run_all(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, *extra_inputs: torch.Tensor) -> tuple:
        """Every graph output; `extra_inputs` follow the caches (method-specific inputs)."""
        mask = apply_sliding_window(mask, positions, self.architecture.sliding_window)
        outputs = self.forward_fn(tokens[None], positions[None], mask.contiguous(), slots,
                                  *self.cache.tensors, *extra_inputs)
        self.forward_passes += 1
        return outputs

    def extend(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Append a causal chunk of tokens after `start` cached ones."""
        slots = torch.arange(start, start + tokens.numel(), device=self.device)
        return self.run(tokens, slots, slots, causal_chunk_mask(start, tokens.numel(), self.device))

    def verify_tree(self, node_tokens: torch.Tensor, prefix_len: int, tree: TreeTensors) -> torch.Tensor:
        """Score a flattened token tree whose root sits at slot `prefix_len`."""
        slots = torch.arange(prefix_len, prefix_len + node_tokens.numel(), device=self.device)
        positions = tree.depth.to(self.device) + prefix_len
        return self.run(node_tokens, positions, slots, tree_mask(prefix_len, tree))
