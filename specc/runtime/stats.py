"""Acceptance and speed statistics, returned as data by every generation."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    new_tokens: int = 0
    target_forward_passes: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    draft_steps_per_round: list[int] = field(default_factory=list)   # tree depth: sequential draft steps
    reused_prompt_tokens: int = 0   # leading prompt tokens whose K/V an earlier generation left (no prefill)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """New tokens per target forward pass, the bonus token included."""
        return self.new_tokens / self.target_forward_passes if self.target_forward_passes else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def draft_steps(self) -> int:
        return sum(self.draft_steps_per_round)

    @property
    def step_acceptance_rate(self) -> float | None:
        """Accepted / draft steps (tree depth): the self-speculation papers' α. Equals
        `acceptance_rate` for chains; for trees the siblings at a depth count once."""
        return self.accepted_tokens / self.draft_steps if self.draft_steps else None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def ctar(self, w: int) -> float | None:
        """Share of draft rounds whose first w drafted tokens were all accepted."""
        rounds = self.accepted_per_round
        return sum(a >= w for a in rounds) / len(rounds) if rounds else None

    def to_json(self) -> dict:
        return {
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
            "target_forward_passes": self.target_forward_passes,
            "step_acceptance_rate": (None if self.step_acceptance_rate is None
                                     else round(self.step_acceptance_rate, 4)),
            "drafted_tokens": self.drafted_tokens,
            "draft_steps": self.draft_steps,
            "accepted_tokens": self.accepted_tokens,
            "new_tokens": self.new_tokens,
            "draft_rounds": len(self.accepted_per_round),
            "mean_drafted_per_round": (round(sum(self.drafted_per_round) / len(self.drafted_per_round), 4)
                                       if self.drafted_per_round else None),
            "ctar": {str(w): self.ctar(w) for w in range(1, 7)},
            "tokens_per_second": round(self.tokens_per_second, 3),
            "wall_seconds": round(self.wall_seconds, 4),
            "prefill_seconds": round(self.prefill_seconds, 4),
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
        }
