"""Turn logits into the distribution a sampler draws from (temperature, top-p).

The same transformation is applied to target and draft logits, so that
speculative sampling preserves exactly what plain sampling would produce.
"""

from __future__ import annotations

import torch

from specc.contract.sampling import SamplingConfig


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Softmax of `logits / temperature`, restricted to the top-p nucleus, in float32."""
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    if config.top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    # Keep a token if the mass before it is still below top_p (the first is always kept).
    drop_sorted = (cumulative - sorted_probs) >= config.top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    if generator is not None and generator.device != probs.device:   # a seeded (CPU) generator draws on the CPU
        probs = probs.cpu()
    return int(torch.multinomial(probs, 1, generator=generator))
