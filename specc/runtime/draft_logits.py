"""What a drafter reads off its draft head's logits.

The distribution it proposes from (whose top-1 probability is the
confidence a stop threshold reads), and, for a head cut to a subset of the
vocabulary by `reduce_draft_vocabulary`, the token id of each row and the
draft distribution q over the whole vocabulary: speculative sampling
compares q with the target's p token by token, so q is zero outside the
kept rows (those tokens can never be drafted) and stays exact.
"""

from __future__ import annotations

import torch

from specc.contract.sampling import SamplingConfig
from specc.runtime.sampling import probabilities

DRAFT_VOCABULARY_KEY = "draft_vocabulary"   # method state: the token id of each row of a reduced draft head


def draft_distribution(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The sampling distribution, or plain softmax for greedy decoding."""
    if sampling.greedy:
        return torch.softmax(logits.float(), dim=-1)
    return probabilities(logits, sampling)


def vocabulary_from_state(state: dict, device) -> torch.Tensor | None:
    """The reduced head's token ids stored in the method state (None: a full head)."""
    ids = state.get(DRAFT_VOCABULARY_KEY)
    return None if ids is None else torch.tensor(ids, dtype=torch.long, device=device)


def token_ids(rows: torch.Tensor, vocabulary: torch.Tensor | None) -> list[int]:
    """The token ids of draft-head rows."""
    return (rows if vocabulary is None else vocabulary[rows]).tolist()


def full_vocabulary(probs: torch.Tensor, vocabulary: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """A draft distribution over the head's rows as one over the whole vocabulary."""
    if vocabulary is None:
        return probs
    return torch.zeros(vocab_size, dtype=probs.dtype, device=probs.device).index_copy_(0, vocabulary, probs)
