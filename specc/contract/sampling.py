"""How the loop is asked to decode: greedy, or sampled with a temperature and top-p."""

from __future__ import annotations

from dataclasses import dataclass

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
