"""Figures from timed runs: spreads over repeats, speedups, pooled acceptance,
time split, and the token-identity check.

Throughput of a system over a group of prompts is computed per repeat as
total new tokens / total seconds; spreads are taken over repeats. Acceptance
figures pool every draft round of every run, so long generations weigh more.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from specc.runtime.stats import GenerationStats

if TYPE_CHECKING:
    from specc.bench.runner import Run

CTAR_WINDOWS = range(1, 7)


@dataclass(frozen=True)
class Spread:
    """Median, min and max over repeats."""

    median: float
    min: float
    max: float
    n: int

    def to_json(self) -> dict:
        return {"median": round(self.median, 4), "min": round(self.min, 4), "max": round(self.max, 4), "n": self.n}


def spread(values: Iterable[float]) -> Spread:
    values = list(values)
    if not values:
        raise ValueError("a spread needs at least one value")
    return Spread(statistics.median(values), min(values), max(values), len(values))


def throughput_by_repeat(runs: list["Run"], system: str, prompt_indices: set[int]) -> list[float]:
    """Tokens/s of `system` on the given prompts, one figure per repeat."""
    tokens: Counter = Counter()
    seconds: Counter = Counter()
    for run in runs:
        if run.system == system and run.prompt_index in prompt_indices:
            tokens[run.repeat] += len(run.token_ids)
            seconds[run.repeat] += run.seconds
    return [tokens[r] / seconds[r] for r in sorted(seconds) if seconds[r] > 0]


def speedup(candidate_tps: list[float], baseline_tps: list[float]) -> Spread:
    """Per-repeat ratio of throughputs (runs of one repeat were interleaved, so
    they saw the same machine state), summarised over repeats."""
    if len(candidate_tps) != len(baseline_tps):
        raise ValueError(f"{len(candidate_tps)} candidate repeats against {len(baseline_tps)} baseline repeats")
    return spread(c / b for c, b in zip(candidate_tps, baseline_tps))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; None if the lists are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def identity(reference: dict[int, list[int]], runs: list["Run"], system: str) -> dict:
    """Share of prompts on which every run of `system` reproduced `reference`
    (prompt index → token ids) exactly."""
    mismatches: dict[int, int] = {}
    checked = set()
    for run in runs:
        if run.system != system or run.prompt_index not in reference:
            continue
        checked.add(run.prompt_index)
        at = first_difference(reference[run.prompt_index], run.token_ids)
        if at is not None and run.prompt_index not in mismatches:
            mismatches[run.prompt_index] = at
    total = len(checked)
    return {
        "identical": total - len(mismatches),
        "total": total,
        "share": (total - len(mismatches)) / total if total else None,
        "mismatches": [{"prompt_index": i, "first_difference": at} for i, at in sorted(mismatches.items())],
    }


def ctar(rounds: list[int], w: int) -> float | None:
    """CTAR(w): share of draft rounds whose first w drafted tokens were all accepted."""
    return sum(a >= w for a in rounds) / len(rounds) if rounds else None


def acceptance(stats: list[GenerationStats]) -> dict:
    """M (bonus token counted), α per drafted token (every tree node) and per
    draft step (tree depth, the papers' α), CTAR pooled over generations, and
    the histogram of accepted draft tokens per round."""
    new_tokens = sum(s.new_tokens for s in stats)
    forwards = sum(s.target_forward_passes for s in stats)
    drafted = sum(s.drafted_tokens for s in stats)
    steps = sum(s.draft_steps for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    rounds = [a for s in stats for a in s.accepted_per_round]
    histogram = Counter(rounds)
    return {
        "mean_accepted_length": new_tokens / forwards if forwards else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "step_acceptance_rate": accepted / steps if steps else None,
        "draft_steps": steps,
        "ctar": {str(w): ctar(rounds, w) for w in CTAR_WINDOWS},
        "draft_rounds": len(rounds),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "target_forward_passes": forwards,
        "new_tokens": new_tokens,
        "accepted_per_round_histogram": {str(k): histogram[k] for k in range(max(rounds, default=-1) + 1)},
    }


def time_split(stats: list[GenerationStats]) -> dict:
    """Shares of generation wall time spent drafting, verifying (target
    forwards after prefill, acceptance and KV commit included), prefilling,
    and elsewhere in the loop."""
    wall = sum(s.wall_seconds for s in stats)
    parts = {
        "draft": sum(s.draft_seconds for s in stats),
        "verify": sum(s.verify_seconds for s in stats),
        "prefill": sum(s.prefill_seconds for s in stats),
    }
    parts["other"] = max(0.0, wall - sum(parts.values()))
    return {
        "seconds": {k: round(v, 4) for k, v in parts.items()} | {"wall": round(wall, 4)},
        "share": {k: (v / wall if wall > 0 else None) for k, v in parts.items()},
    }


def decode_throughput(stats: list[GenerationStats]) -> float | None:
    """Tokens/s after prefill (the first token comes from the prefill), the
    phase the speedup formulas model."""
    tokens = sum(s.new_tokens - 1 for s in stats)
    seconds = sum(s.wall_seconds - s.prefill_seconds for s in stats)
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def decode_throughput_by_repeat(runs: list["Run"], system: str, prompt_indices: set[int]) -> list[float] | None:
    """`decode_throughput` of `system` on the given prompts, one figure per
    repeat; None if the system reports no statistics or decoded nothing."""
    by_repeat: dict[int, list[GenerationStats]] = {}
    for run in runs:
        if run.system == system and run.prompt_index in prompt_indices:
            if run.stats is None:
                return None
            by_repeat.setdefault(run.repeat, []).append(run.stats)
    figures = [decode_throughput(by_repeat[r]) for r in sorted(by_repeat)]
    return None if not figures or None in figures else figures
