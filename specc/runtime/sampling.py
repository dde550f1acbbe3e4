"""Turn logits into the distribution a sampler draws from (temperature, top-p).

The same transformation is applied to target and draft logits, so that
speculative sampling preserves exactly what plain sampling would produce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specc.errors import UsageError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise UsageError(f"--temperature {self.temperature} is negative; use 0 for greedy or a positive value")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"--top-p {self.top_p} is outside (0, 1]; use e.g. 0.9, or 1 to disable")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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
