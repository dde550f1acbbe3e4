"""Choose S3D's skipped block and γ at compile time from the paper's own model (eq. 12).

IF(β, γ) = τ(γ) / (δ + c_draft(β, γ) + c_verify(γ)), everything in units of
one plain single-token target forward on this machine:

- c_verify(γ): the target's forward over γ + 1 rows after a prefix, measured.
  The paper takes it as 1; on a CPU verifying more rows costs more.
- c_draft(β, γ): the candidate draft graph's forward over γ rows, measured.
  The paper's β is a parameter share; a measured time also covers the LM
  head and attention, which no share of layers accounts for.
- τ(γ): expected tokens per round from α_k, the held-out top-1 agreement at
  draft position k after a short pilot training of that candidate. Agreement
  is teacher-forced (the tokens before k are the target's), which is exactly
  α_k given the first k − 1 were accepted.
- δ, the loop's own per-round overhead, is not known at compile time and is
  taken as 0; `specc bench` measures it and sets its own eq. 12 prediction
  beside the measured speedup.

Costs are timed in eager, on the device training runs on, at the training
window's length as the prefix, every graph and row count interleaved over
several rounds, keeping each one's fastest time (other work on the machine
only adds time). Not with the engine's backend: that would lower every
candidate's draft graph for every row count, one backend compile each, for
costs that eq. 12 uses only as ratios to a plain forward timed the same
way. The report records where the costs were timed beside what the engine
is lowered for, so a prediction for another backend or device reads as the
estimate it is. A pilot of a few dozen steps underestimates every
candidate's final acceptance; the choice relies on the ranking, and the
chosen candidate keeps training from its pilot weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
from tqdm import tqdm

from specc.console.progress import progress_bar
from specc.contract.descriptor import TrainingContext
from specc.runtime.speedup_model import tokens_per_round
from specc.methods.s3d.skip_middle_layers import middle_block, resolve_block
from specc.runtime.masks import causal_chunk_mask
from specc.train.inputs import empty_caches

TIMING_ROUNDS = 7


@dataclass
class Candidate:
    """One skipped block, its draft graph (pilot-trained), and what eq. 12 needs of it."""

    block: tuple[int, int]
    module: torch.fx.GraphModule
    untrained: list[float]       # held-out top-1 agreement at draft positions 1..γ_max, before the pilot
    agreement: list[float]       # the same after the pilot
    draft_cost: list[float]      # [γ - 1]: one draft forward over γ rows, in plain target forwards

    def improvement(self, gamma: int, verify_cost: list[float], agreement: list[float] | None = None) -> float:
        """Eq. 12 with δ = 0: τ(γ) over the round's draft and verification cost (with the
        pilot's agreement unless another, e.g. after the full training, is given)."""
        agreement = self.agreement if agreement is None else agreement
        return tokens_per_round(agreement[:gamma]) / (self.draft_cost[gamma - 1] + verify_cost[gamma])

    def best_gamma(self, verify_cost: list[float]) -> int:
        gammas = range(1, len(self.agreement) + 1)
        return max(gammas, key=lambda g: self.improvement(g, verify_cost))

    def to_json(self, verify_cost: list[float]) -> dict:
        return {"skipped_layers": list(self.block), "untrained_agreement_by_position": self.untrained,
                "agreement_by_position": self.agreement,
                "draft_cost_by_gamma": [round(c, 3) for c in self.draft_cost],
                "improvement_by_gamma": [round(self.improvement(g, verify_cost), 3)
                                         for g in range(1, len(self.agreement) + 1)]}


def candidate_blocks(config, num_layers: int) -> list[tuple[int, int]]:
    """The explicit block alone, else the centred block of each ratio (duplicates dropped)."""
    if config.skip_layers:
        return [resolve_block(config.skip_config(), num_layers)]
    blocks = [middle_block(num_layers, ratio) for ratio in config.select_ratios]
    return list(dict.fromkeys(b for b in blocks if b is not None))


def forward_call(module, arch, dtype, rows: int, prefix: int, extra=lambda rows: ()):
    """One forward over `rows` new rows after `prefix` cached ones, inputs built once."""
    caches = empty_caches(arch, arch.num_layers, prefix + rows, dtype)
    positions = torch.arange(prefix, prefix + rows)
    args = (torch.zeros(1, rows, dtype=torch.long), positions[None], causal_chunk_mask(prefix, rows), positions,
            *caches, *extra(rows))
    return lambda: module(*args)


def fastest_seconds(calls: dict, rounds: int = TIMING_ROUNDS) -> dict:
    """Each call's fastest wall time over `rounds` interleaved rounds. Other work on the
    machine only ever adds time, so the minimum is the least disturbed estimate, and
    interleaving spreads any slow stretch over every call alike."""
    best = dict.fromkeys(calls, float("inf"))
    with torch.no_grad():
        for call in calls.values():
            call()   # warm-up
        for _ in range(rounds):
            for key, call in calls.items():
                start = time.perf_counter()
                call()
                best[key] = min(best[key], time.perf_counter() - start)
    return best


def mask_rows(rows: int) -> tuple[torch.Tensor]:
    """The draft's `is_mask` input: the root, then mask tokens."""
    is_mask = torch.ones(1, rows, dtype=torch.bool)
    is_mask[0, 0] = False
    return (is_mask,)


@dataclass
class Selection:
    config: object
    chosen: Candidate
    verify_cost: list[float]
    report: dict

    def predicted_speedup(self, agreement: list[float]) -> float:
        return self.chosen.improvement(self.config.draft_tokens, self.verify_cost, agreement)


def candidate_draft(context: TrainingContext, config) -> torch.fx.GraphModule:
    """The draft graph for `config`'s block, built as the engine's would be."""
    return context.build(config, names=("draft",)).graphs["draft"].module


def select_by_eq12(context: TrainingContext, config, pilot) -> Selection:
    """Pilot-train and time every candidate block; keep the (block, γ) with the largest IF.

    `pilot(module, gamma_max)` trains a candidate's draft-only parameters for
    `select_steps` and returns its held-out agreement by draft position before
    and after."""
    arch = context.program.graphs["target"].architecture
    target = context.program.graphs["target"].module
    dtype = next(target.parameters()).dtype
    gamma_max, prefix = config.select_max_tokens, config.train_seq_len
    blocks = candidate_blocks(config, arch.num_layers)
    drafts = [candidate_draft(context, replace(config, skip_layers=block)) for block in blocks]
    calls = {("target", rows): forward_call(target, arch, dtype, rows, prefix) for rows in range(1, gamma_max + 2)}
    for index, module in enumerate(drafts):
        calls |= {(index, rows): forward_call(module, arch, dtype, rows, prefix, mask_rows)
                  for rows in range(1, gamma_max + 1)}
    seconds = fastest_seconds(calls)
    one = seconds["target", 1]
    verify_cost = [seconds["target", rows] / one for rows in range(1, gamma_max + 2)]   # index γ: γ + 1 rows
    candidates = []
    for index, (block, module) in enumerate(
            progress_bar(list(zip(blocks, drafts)), desc="s3d: eq. 12 candidates", unit="block")):
        untrained, agreement = pilot(module, gamma_max)
        draft_cost = [seconds[index, rows] / one for rows in range(1, gamma_max + 1)]
        candidates.append(Candidate(block, module, untrained, agreement, draft_cost))
    chosen = max(candidates, key=lambda c: c.improvement(c.best_gamma(verify_cost), verify_cost))
    gamma = chosen.best_gamma(verify_cost)
    predicted = chosen.improvement(gamma, verify_cost)
    tqdm.write(f"s3d: eq. 12 chose skipped layers {chosen.block[0]}..{chosen.block[1]} and γ {gamma} "
               f"(predicted {predicted:.2f}x over none before loop overhead)")
    report = {"skipped_layers": list(chosen.block), "draft_tokens": gamma,
              "predicted_speedup_after_pilot": round(predicted, 3),
              "plain_forward_seconds": round(one, 5), "verify_cost_by_gamma": [round(v, 3) for v in verify_cost[1:]],
              "pilot_steps": config.select_steps, "candidates": [c.to_json(verify_cost) for c in candidates],
              "costs_timed_with": {"backend": "eager", "device": str(next(target.parameters()).device)},
              "engine_lowered_for": {"backend": context.engine_backend, "device": str(context.engine_device)}}
    return Selection(replace(config, skip_layers=chosen.block, draft_tokens=gamma), chosen, verify_cost, report)
