"""SWIFT's on-the-fly layer-set optimisation: which sublayers the draft skips.

The search space is every attention and MLP sublayer that has a skip branch
(layers 1..L-2). Candidates skip a fixed number of them, `int(skip_ratio ·
n)` (at least one). The incumbent starts as the odd layers (attention and MLP
of layers 1, 3, 5, …), as in the reference code. Each try proposes a
candidate: a uniformly random one, except every `bayes_interval`-th try,
which asks a Gaussian-process model fitted to every score seen so far
(scikit-optimize, lower confidence bound with `kappa` on the negated score,
i.e. the paper's UCB) and skips the sublayers with the largest suggested
coordinates. A candidate replaces the incumbent only if it scores higher.
Every candidate is tried at most once (the incumbent counts as tried): a
suggestion already tried is replaced by a random untried one. The search
stops for good when a score exceeds `max_score`, after `max_tolerance`
tries without improvement, after `max_tries` tries, or when every skip set
of the candidate size has been tried (a model with 4 skippable sublayers
has only 4 sets of 1).

The caller measures scores (see `SwiftDrafter.matchness`); this class only
decides what to try next and keeps the state, which lives as long as the
drafter, so it carries across prompts, and round-trips through JSON.

One deviation from the reference code, on purpose: when the caller moves to
a new scoring window (a new prompt) it re-scores the incumbent there
(`rescore`), so a candidate is compared with the incumbent on the same
tokens rather than with a score measured on another prompt.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from itertools import combinations


@dataclass(frozen=True)
class SearchSettings:
    skip_ratio: float = 0.45
    bayes_interval: int = 25
    kappa: float = 2.5
    max_score: float = 0.95
    max_tolerance: int = 300
    max_tries: int = 1000
    seed: int = 0


@dataclass
class SearchState:
    best: frozenset[str]
    best_score: float | None = None
    tries: int = 0
    since_improvement: int = 0
    stop_reason: str | None = None
    observed: list[tuple[frozenset[str], float]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"best": sorted(self.best), "best_score": self.best_score, "tries": self.tries,
                "since_improvement": self.since_improvement, "stop_reason": self.stop_reason}


class LayerSetSearch:
    def __init__(self, sublayers: tuple[str, ...], settings: SearchSettings = SearchSettings(),
                 initial: frozenset[str] | None = None):
        if not sublayers:
            raise ValueError("the layer-set search needs at least one skippable sublayer")
        unknown = sorted(set(initial or ()) - set(sublayers))
        if unknown:
            raise ValueError(f"skip set names {unknown}, which are not skippable sublayers {list(sublayers)}")
        self.sublayers = tuple(sublayers)
        self.settings = settings
        self.num_skipped = max(1, int(settings.skip_ratio * len(sublayers)))
        self.state = SearchState(best=frozenset(initial) if initial is not None else odd_layers(sublayers))
        self._rng = random.Random(settings.seed)
        self.space_size = math.comb(len(self.sublayers), self.num_skipped)
        self.tried: set[frozenset[str]] = {self.state.best} if len(self.state.best) == self.num_skipped else set()
        if self.exhausted:
            self.state.stop_reason = f"all {self.space_size} candidate skip sets tried"

    @property
    def exhausted(self) -> bool:
        """Every skip set of the candidate size has been scored."""
        return len(self.tried) >= self.space_size

    @property
    def best(self) -> frozenset[str]:
        return self.state.best

    @property
    def active(self) -> bool:
        return self.state.stop_reason is None

    def suggest(self) -> frozenset[str]:
        """The next candidate: Bayesian every `bayes_interval`-th try, else random."""
        if (self.state.tries + 1) % self.settings.bayes_interval == 0 and len(self.state.observed) >= 2:
            candidate = self._bayesian()
            if candidate not in self.tried:
                return candidate
        return self._random_untried()

    def _random_untried(self) -> frozenset[str]:
        if self.space_size <= 20_000:   # small space: draw from the untried sets exactly
            untried = [frozenset(c) for c in combinations(self.sublayers, self.num_skipped)
                       if frozenset(c) not in self.tried]
            if untried:
                return self._rng.choice(untried)
        for _ in range(1000):   # huge space: a random draw is almost surely untried
            candidate = frozenset(self._rng.sample(self.sublayers, self.num_skipped))
            if candidate not in self.tried:
                return candidate
        return frozenset(self._rng.sample(self.sublayers, self.num_skipped))

    def rescore(self, score: float) -> None:
        """The incumbent's score on a new window: the bar candidates must beat."""
        self.state.observed.append((self.state.best, score))
        self.state.best_score = score
        if score > self.settings.max_score:
            self.state.stop_reason = f"incumbent matchness {score:.3f} > {self.settings.max_score}"

    def report(self, candidate: frozenset[str], score: float) -> bool:
        """Record a tried candidate; returns whether it became the incumbent."""
        state, settings = self.state, self.settings
        state.observed.append((candidate, score))
        state.tries += 1
        self.tried.add(candidate)
        improved = state.best_score is None or score > state.best_score
        if improved:
            state.best, state.best_score, state.since_improvement = candidate, score, 0
        else:
            state.since_improvement += 1
        if improved and score > settings.max_score:
            state.stop_reason = f"matchness {score:.3f} > {settings.max_score}"
        elif state.since_improvement >= settings.max_tolerance:
            state.stop_reason = f"{state.since_improvement} tries without improvement"
        elif state.tries >= settings.max_tries:
            state.stop_reason = f"{state.tries} tries"
        elif self.exhausted:
            state.stop_reason = f"all {self.space_size} candidate skip sets tried"
        return improved

    def _bayesian(self) -> frozenset[str]:
        from skopt import Optimizer  # scikit-optimize: heavy, and only needed every bayes_interval tries

        optimizer = Optimizer([(0.0, 1.0)] * len(self.sublayers), base_estimator="GP", acq_func="LCB",
                              acq_func_kwargs={"kappa": self.settings.kappa}, acq_optimizer="sampling",
                              n_initial_points=1, random_state=self.settings.seed + self.state.tries)
        points = [[float(name in skipped) for name in self.sublayers] for skipped, _ in self.state.observed]
        optimizer.tell(points, [-score for _, score in self.state.observed])
        suggestion = optimizer.ask()
        ranked = sorted(range(len(self.sublayers)), key=lambda i: -suggestion[i])
        return frozenset(self.sublayers[i] for i in ranked[: self.num_skipped])


def odd_layers(sublayers: tuple[str, ...]) -> frozenset[str]:
    """Attention and MLP of every odd layer: SWIFT's initial skip set."""
    return frozenset(name for name in sublayers if int(name.rsplit("_", 1)[1]) % 2 == 1)


def describe_skip_set(skip: frozenset[str]) -> str:
    """'attn 1,3 · mlp 1,2' — the layers whose attention / MLP the draft skips."""
    parts = []
    for kind in ("attn", "mlp"):
        layers = sorted(int(name.rsplit("_", 1)[1]) for name in skip if name.startswith(f"{kind}_"))
        parts.append(f"{kind} {','.join(map(str, layers)) or '-'}")
    return " · ".join(parts)
