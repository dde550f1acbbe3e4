"""Inputs for running a decoding graph on one training window from an empty cache."""

from __future__ import annotations

import torch

from specc.train.packing import packed_decoding_inputs


def decoding_inputs(tokens: torch.Tensor, sliding_window: int | None) -> tuple:
    """tokens [1, T], positions [1, T], a causal mask (within the architecture's sliding
    window, as the engine's steps see it) and cache slots 0..T-1: one window packed alone."""
    return packed_decoding_inputs([tokens], sliding_window)


def empty_caches(arch, layers: int, length: int, dtype, device="cpu") -> list[torch.Tensor]:
    """K and V caches for `layers` layers, one spare slot past `length` (see KVCache)."""
    shape = (1, arch.num_key_value_heads, length + 1, arch.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2 * layers)]
