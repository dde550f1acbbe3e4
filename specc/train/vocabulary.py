"""A draft head's reduced vocabulary: which token ids it keeps, and the map into its rows."""

from __future__ import annotations

import torch


def frequent_tokens(windows: list[torch.Tensor], arch, size: int) -> list[int]:
    """`size` token ids: end-of-sequence ids first, then by frequency in `windows`,
    then (unseen tokens) by id, which for BPE vocabularies roughly follows merge order."""
    counts = torch.bincount(torch.cat(windows), minlength=arch.vocab_size)[: arch.vocab_size].float()
    counts[list(arch.eos_token_ids)] = float("inf")
    order = torch.argsort(-counts, stable=True)
    return order[:size].tolist()


def student_index(ids: list[int], vocab_size: int) -> torch.Tensor:
    """[vocab_size]: each token's row in the reduced head, -1 where it has none."""
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[torch.tensor(ids)] = torch.arange(len(ids))
    return index
