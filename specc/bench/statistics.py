"""Figures from timed runs: spreads over repeats, speedups, pooled acceptance
(per depth too), time split, the token-identity check, and a composed
drafter's branch shares.

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


def per_depth_acceptance(accepted_per_round: list[int], depth_per_round: list[int]) -> list[float | None]:
    """α_d for d = 1 … the deepest round: the acceptance at depth d given the
    draft went that deep and depths 1..d − 1 were accepted.

    A round that drafted D deep (`GenerationStats.draft_steps_per_round`, a
    tree's depth, a chain's length) and accepted a tokens reached depth d when
    d ≤ D and a ≥ d − 1, and accepted there when a ≥ d; α_d = accepted / reached
    over all rounds, None where no round reached d. For chains this is the
    share of rounds that drafted a d-th token after accepting the first d − 1
    that also accepted it. A tree reaches d on depth alone: an accepted path
    ending at a leaf shallower than the tree counts as a rejection below it
    (the statistics keep the tree's depth, not each path's).

    Giving every round the same depth γ counts a drafter's early stop as a
    rejection, α_d = CTAR(d) / CTAR(d − 1): the convention under which S3D's
    τ(γ) reproduces the measured tokens per round."""
    if len(accepted_per_round) != len(depth_per_round):
        raise ValueError(f"{len(accepted_per_round)} rounds of accepted counts against {len(depth_per_round)} "
                         f"draft depths; GenerationStats records one of each per draft round")
    deepest = max(depth_per_round, default=0)
    reached, accepted = [0] * deepest, [0] * deepest
    for tokens, depth in zip(accepted_per_round, depth_per_round):
        for d in range(1, min(depth, tokens + 1) + 1):
            reached[d - 1] += 1
            accepted[d - 1] += tokens >= d
    return [a / r if r else None for a, r in zip(accepted, reached)]


def acceptance(stats: list[GenerationStats]) -> dict:
    """M (bonus token counted), α per drafted token (every tree node), per
    draft step (tree depth, the papers' α) and per depth (`per_depth_acceptance`),
    CTAR pooled over generations, and the histogram of accepted draft tokens
    per round."""
    new_tokens = sum(s.new_tokens for s in stats)
    forwards = sum(s.target_forward_passes for s in stats)
    drafted = sum(s.drafted_tokens for s in stats)
    steps = sum(s.draft_steps for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    rounds = [a for s in stats for a in s.accepted_per_round]
    depths = [d for s in stats for d in s.draft_steps_per_round]
    histogram = Counter(rounds)
    return {
        "mean_accepted_length": new_tokens / forwards if forwards else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "step_acceptance_rate": accepted / steps if steps else None,
        "draft_steps": steps,
        "alpha_per_depth": per_depth_acceptance(rounds, depths),
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


def branch_shares(reports: list[dict]) -> dict | None:
    """Where a composed drafter's accepted tokens came from, over the runs' method reports
    that have "branches" (`ComposedDrafter.method_report`; None when none has): each branch's
    counts summed over them, its share of all accepted tokens and its own acceptance
    (accepted / proposed). A node several branches drafted counts for each of them, so the
    shares may add up to more than 1."""
    composed = [r for r in reports if "branches" in r]
    if not composed:
        return None
    total = sum(r["accepted_tokens"] for r in composed)
    sums: dict[str, Counter] = {}
    for report in composed:
        for name, counts in report["branches"].items():
            # the counts only: a branch's own report ("method") stays with its run
            sums.setdefault(name, Counter()).update(
                {k: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)})
    branches = {}
    for name, counts in sums.items():
        accepted, proposed = counts["accepted_tokens"], counts["proposed_tokens"]
        branches[name] = {**counts, "share_of_accepted": accepted / total if total else None,
                          "acceptance_rate": accepted / proposed if proposed else None}
    return {"accepted_tokens": total, "runs": len(composed), "branches": branches}
