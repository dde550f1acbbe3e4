"""SpecEE at run time: the lossy `ar` target, or the lossless early-exit drafter.

Graphs: `verify` (the full target, also returning its top-layer hidden
state), `layerwise` (the target with exit predictors, one segment per
layer) and `draft_head`. `verify` and `layerwise` share one KV cache.

- `ar` (the paper's public path): after the prompt, every token is one
  early-exit step and is emitted unverified — lossy; quality is reported
  against the dense model.
- `lossless` (beyond the paper): early-exit steps draft a chain until a
  step finds no exit (or `max_draft_steps`); one `verify` forward checks
  it and rewrites every drafted slot's K/V with the full model's, so the
  output is the target's, greedy or sampled.
"""

from __future__ import annotations

import torch

from specc.errors import SpeccError
from specc.methods.specee.config import DRAFT_VOCABULARY_KEY, SCHEDULE_KEY, SpecEEConfig
from specc.methods.specee.early_exit import DraftHead, EarlyExit, ExitSchedule
from specc.methods.specee.layerwise import LayerwiseForward
from specc.runtime.acceptance import Acceptance
from specc.runtime.cached_model import CachedModel
from specc.runtime.context import MethodContext
from specc.runtime.drafter import Draft, DraftBudget, MethodRuntime
from specc.runtime.sampling import SamplingConfig, probabilities, sample
from specc.runtime.tree import TreeSpec, tree_tensors
from specc.runtime.verification import Verification
from specc.runtime.warm_up import untaken_size

FEATURE = "final_hidden"
DEFAULT_THRESHOLD = 0.5   # the paper's, for an engine whose threshold was never calibrated


def build_runtime(ctx: MethodContext, config: SpecEEConfig) -> MethodRuntime:
    full = ctx.model("verify")
    early = build_early_exit(ctx, config, full)
    if config.mode == "ar":
        return MethodRuntime(EarlyExitTarget(full, early))
    return MethodRuntime(full, EarlyExitDrafter(early, config.max_draft_steps))


def build_early_exit(ctx: MethodContext, config: SpecEEConfig, full: CachedModel) -> EarlyExit:
    layerwise = LayerwiseForward(ctx.modules["layerwise"], ctx.lower_segment, config.kv_policy)
    vocabulary = ctx.state.get(DRAFT_VOCABULARY_KEY)
    head = DraftHead(ctx.model("draft_head"),
                     None if vocabulary is None else torch.tensor(vocabulary, device=ctx.device),
                     config.candidates)
    schedule_state = ctx.state.get(SCHEDULE_KEY) or {}
    offline = tuple(schedule_state.get("offline", layerwise.scored_layers))
    schedule = ExitSchedule(offline, layerwise.scored_layers, config.online_tokens)
    threshold = config.exit_threshold or schedule_state.get("threshold", DEFAULT_THRESHOLD)
    early = EarlyExit(layerwise, head, full.cache, schedule, threshold, ctx.device)
    if ctx.compiles_lazily:
        _warm_up(early, full)
    return early


class EarlyExitTarget:
    """`ar` mode: the prompt runs the full model; each later token one early-exit step."""

    def __init__(self, full: CachedModel, early: EarlyExit):
        self.full = full
        self.early = early
        self.device = full.device
        self.architecture = full.architecture
        self.feature: torch.Tensor | None = None

    @property
    def max_seq_len(self) -> int:
        return self.full.max_seq_len

    def prefill(self, tokens: torch.Tensor, start: int) -> Verification:
        if start == 0 or tokens.numel() > 1:
            return self._full(tokens, start)
        result = self.early.step(int(tokens[0]), start, self.feature)
        self.feature = result.hidden[0, -1]
        slots = torch.tensor([start], device=self.device)
        return Verification(result.logits[0], {"exit_layer": torch.tensor([result.exit_layer])}, slots)

    def method_report(self) -> dict:
        return self.early.take_report()

    def verify_tree(self, draft: Draft, prefix_len: int) -> Verification:
        raise SpeccError("specee mode=ar decodes one early-exit token per step; it verifies no drafts")

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        """Nothing to move: every step is a chain of one token."""

    def _full(self, tokens: torch.Tensor, start: int) -> Verification:
        if start == 0:
            self.early.reset()
        verification = self.full.prefill(tokens, start)
        self.early.written_by_full_model(verification.slots)
        features = verification.extras[FEATURE]
        self.early.head.prime(tokens, start, _previous_features(features, self.feature))
        self.feature = features[-1]
        return verification


class EarlyExitDrafter:
    """`lossless` mode: early-exit tokens are a chain the full model verifies."""

    def __init__(self, early: EarlyExit, max_steps: int):
        self.early = early
        self.max_steps = max_steps
        self.feature: torch.Tensor | None = None
        self._undrafted_root: int | None = None   # a root the loop stepped without a draft

    def method_report(self) -> dict:
        return self.early.take_report()

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        self.early.reset()
        self.early.written_by_full_model(prefill.slots)
        features = prefill.extras[FEATURE]
        self.early.head.prime(prompt, 0, _previous_features(features, None))
        self.feature = features[-1]

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        depth_limit = min(self.max_steps, budget.max_depth, budget.max_nodes - 1)
        if depth_limit < 1:
            self._undrafted_root = tokens[-1]
            return None
        prefix_len = len(tokens) - 1
        chain, probs, feature = [tokens[-1]], [], self.feature
        for depth in range(depth_limit):
            result = self.early.step(chain[-1], prefix_len + depth, feature)
            logits = result.logits[0, -1]
            if sampling.greedy:
                chain.append(int(logits.argmax()))
            else:
                q = probabilities(logits, sampling)
                chain.append(sample(q, generator))
                probs.append(q)
            feature = result.hidden[0, -1]
            if result.exit_layer == self.early.layerwise.num_layers - 1:
                break
        device = self.early.device
        tree = tree_tensors(TreeSpec.chain(len(chain) - 1))
        return Draft(tree, torch.tensor(chain, device=device), torch.stack(probs) if probs else None)

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        self.early.written_by_full_model(verification.slots)
        features = verification.extras[FEATURE]
        start = int(verification.slots[0])
        if draft is None:
            if self._undrafted_root is not None:   # else the loop stepped without asking: the last token
                self.early.head.prime(verification.slots.new_tensor([self._undrafted_root]), start,
                                      self.feature[None])
                self._undrafted_root = None
            self.feature = features[-1]
            return
        path = acceptance.path
        accepted = draft.node_tokens[path[1:]]
        if accepted.numel():
            self.early.head.prime(accepted, start + 1, features[path[:-1]])
        self.feature = features[path[-1]]


def _previous_features(features: torch.Tensor, before: torch.Tensor | None) -> torch.Tensor:
    """Each token's draft-head input: the feature of the token before it (zeros before the first)."""
    first = torch.zeros_like(features[:1]) if before is None else before[None]
    return torch.cat([first, features[:-1]])


def _warm_up(early: EarlyExit, full: CachedModel) -> None:
    """Compile every segment (layers, K/V-only copies, head) for one-token steps before timing
    starts, at a cache length equal to no static size (see `specc.runtime.warm_up`)."""
    taken = early.layerwise.static_sizes | set(full.cache.tensors[0].shape)
    slot = untaken_size(taken, 2) - 1
    with torch.inference_mode():
        early.step(0, slot, torch.zeros(full.architecture.hidden_size, dtype=full.cache.tensors[0].dtype),
                   force_exit=early.layerwise.scored_layers[0])
    early.reset()
    early.exit_layers.clear()
