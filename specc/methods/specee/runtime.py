"""SpecEE at run time: the lossy `ar` target, the lossless early-exit drafter, or tree mode.

Graphs: `verify` (the full target, also returning its top-layer hidden
state), `layerwise` (the target with exit predictors, one segment per
layer) and `draft_head`. `verify` and `layerwise` share one KV cache.

- `ar` (the paper's public path): after the prompt, every token is one
  early-exit step and is emitted unverified — lossy; quality is reported
  against the dense model.
- `lossless` (beyond the paper): early-exit steps draft a chain. A step
  that runs every layer on an exact context is itself exact (its token is
  the target's and its K/V the full model's), so the leading steps of a
  round that found no exit need no verification; from the first exit on
  the chain is a draft. Drafting stops at the first step after an exit
  that finds none (or at `max_draft_steps`), and one `verify` forward runs
  only the rows from the first exited step on, rewriting their K/V with
  the full model's: the output is the target's, greedy or sampled.
- `tree` (the paper's tree mode, lossy): see `hyper_token`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget, MethodRuntime
from specc.contract.sampling import SamplingConfig
from specc.contract.side_channel import SideChannel, carried
from specc.contract.tree import TreeSpec, tree_tensors
from specc.contract.verification import Acceptance, Verification
from specc.errors import SpeccError, UsageError
from specc.methods.specee.config import SCHEDULE_KEY, SpecEEConfig
from specc.methods.specee.early_exit import (FEATURE, DraftHead, EarlyExit, ExitSchedule, FollowsAcceptedTokens,
                                            head_follower, previous_features)
from specc.methods.specee.hyper_token import HyperTokenVerifier, TreeDrafter
from specc.methods.specee.layerwise import LayerwiseForward
from specc.runtime.cached_model import CachedModel
from specc.runtime.context import MethodContext
from specc.runtime.draft_follower import DraftFollower
from specc.runtime.draft_logits import vocabulary_from_state
from specc.runtime.sampling import probabilities, sample
from specc.runtime.warm_up import untaken_size

DEFAULT_THRESHOLD = 0.5   # the paper's, for an engine whose threshold was never calibrated
EXIT_LAYER = "exit_layer"   # `ar` mode's output of an early-exit step: the layer its token left at, [1]


@dataclass(frozen=True)
class ExactRows(SideChannel):
    """What a lossless draft carries to the verifier: its leading nodes that ran every layer."""

    logits: torch.Tensor      # [k, vocab]
    features: torch.Tensor    # [k, hidden]: the top layer's output


def build_runtime(ctx: MethodContext, config: SpecEEConfig) -> MethodRuntime:
    full = ctx.model("verify")
    early = build_early_exit(ctx, config, full)
    if config.mode == "ar":
        return MethodRuntime(EarlyExitTarget(full, early))
    if config.mode == "tree":
        if FEATURE not in ctx.signatures["draft_head"].output_names:
            raise UsageError("this engine's draft head returns no feature for deeper tree levels: mode=tree "
                             "needs an engine compiled with --set mode=tree")
        verifier, drafter = HyperTokenVerifier(full, early), TreeDrafter(early, config.tree_depth, config.tree_width,
                                                                   head_follower(full))
        if ctx.compiles_lazily:
            warm_up_tree(verifier, drafter)
        return MethodRuntime(verifier, drafter)
    return MethodRuntime(PartialVerifier(full), EarlyExitDrafter(early, config.max_draft_steps, head_follower(full)))


def build_early_exit(ctx: MethodContext, config: SpecEEConfig, full: CachedModel) -> EarlyExit:
    layerwise = LayerwiseForward(ctx.modules["layerwise"], ctx.lower_segment, config.resolved_kv_policy,
                                 full.architecture.sliding_window)
    head = DraftHead(ctx.model("draft_head"), vocabulary_from_state(ctx.state, ctx.device), config.candidates)
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

    capabilities = Capabilities(reports=True)

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
        return Verification(result.logits[0], {EXIT_LAYER: torch.tensor([result.exit_layer])}, slots)

    def method_report(self) -> dict:
        return self.early.take_report()

    def verify_tree(self, draft: Draft, prefix_len: int) -> Verification:
        raise SpeccError("specee mode=ar decodes one early-exit token per step; it verifies no drafts")

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        """Nothing to move: every step is a chain of one token."""

    def _full(self, tokens: torch.Tensor, start: int) -> Verification:
        if start == 0:
            self.early.reset()
        else:
            self.early.finish_pending()
        verification = self.full.prefill(tokens, start)
        self.early.written_by_full_model(verification.slots)
        features = verification.outputs[FEATURE]
        self.early.head.prime(tokens, start, previous_features(features, self.feature))
        self.feature = features[-1]
        return verification


class PartialVerifier:
    """The full target, verifying only the draft rows the drafter could not compute exactly.

    The draft carries the logits and top-layer features of its leading exact
    nodes (`ExactRows`); the `verify` graph runs on the remaining nodes only,
    as a causal chunk after them."""

    capabilities = Capabilities(resumable=True)   # every committed slot holds the full model's K/V, every layer

    def __init__(self, full: CachedModel):
        self.full = full
        self.device = full.device
        self.architecture = full.architecture

    @property
    def max_seq_len(self) -> int:
        return self.full.max_seq_len

    @property
    def forward_passes(self) -> int:
        return self.full.forward_passes

    def prefill(self, tokens: torch.Tensor, start: int) -> Verification:
        return self.full.prefill(tokens, start)

    def verify_tree(self, draft: Draft, prefix_len: int) -> Verification:
        if draft.tree.spec.widths != (1,) * draft.tree.spec.depth:   # merged with lookup branches
            return self.full.verify_tree(draft, prefix_len)
        exact = carried(draft, ExactRows)
        known = 0 if exact is None else exact.logits.shape[0]
        rest = self.full.run_chunk(draft.node_tokens[known:], prefix_len + known)
        if known == 0:
            return rest
        slots = torch.arange(prefix_len, prefix_len + draft.node_tokens.numel(), device=self.device)
        features = torch.cat([exact.features, rest.outputs[FEATURE]])
        return Verification(torch.cat([exact.logits, rest.logits]), {FEATURE: features}, slots)

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        self.full.commit(base, accepted_offsets)


class EarlyExitDrafter(FollowsAcceptedTokens):
    """`lossless` mode: early-exit tokens are a chain the full model verifies. It composes with
    the lookup branches: its exact leading nodes keep their indices in a merged draft, and
    the verifier recomputes a merged tree whole."""

    # resumable: the head's KV holds a reused prefix
    capabilities = Capabilities(resumable=True, composable=True, reports=True)

    def __init__(self, early: EarlyExit, max_steps: int, follower: DraftFollower):
        self.early = early
        self.max_steps = max_steps
        self.follower = follower

    def method_report(self) -> dict:
        return self.early.take_report()

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        self.early.reset()
        self.early.written_by_full_model(prefill.slots)
        self.follower.begin(prompt, prefill)

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        depth_limit = min(self.max_steps, budget.max_depth, budget.max_nodes - 1)
        if depth_limit < 1:
            return None
        prefix_len = len(tokens) - 1
        chain, probs, feature = [tokens[-1]], [], self._catch_up(tokens)
        exact_logits, exact_hidden, exited = [], [], False
        last_layer = self.early.layerwise.num_layers - 1
        for depth in range(depth_limit):
            result = self.early.step(chain[-1], prefix_len + depth, feature)
            logits, feature = result.logits[0, -1], result.hidden[0, -1]
            ran_every_layer = result.exit_layer == last_layer
            if ran_every_layer and not exited and not budget.chain_only:
                exact_logits.append(logits)
                exact_hidden.append(feature)
            if sampling.greedy:
                chain.append(int(logits.argmax()))
            else:
                q = probabilities(logits, sampling)
                chain.append(sample(q, generator))
                probs.append(q)
            if ran_every_layer and exited:
                break
            exited = exited or not ran_every_layer
        tree = tree_tensors(TreeSpec.chain(len(chain) - 1))
        exact = ExactRows(torch.stack(exact_logits), torch.stack(exact_hidden)) if exact_logits else None
        return Draft(tree, torch.tensor(chain, device=self.early.device), torch.stack(probs) if probs else None,
                     carries=exact)

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        self.early.written_by_full_model(verification.slots)
        self.follower.observe(draft, acceptance, verification)


def _warm_up(early: EarlyExit, full: CachedModel) -> None:
    """Compile every segment (layers, K/V-only copies, head) for one-token steps (and, under the
    `finish` policy, for the extra rows) before timing starts, at cache lengths equal to no static
    size (see `specc.runtime.warm_up`)."""
    taken = early.layerwise.static_sizes | set(full.cache.tensors[0].shape)
    slot = untaken_size(taken, 2) - 1
    while slot + 2 in taken:   # `finish` steps a second token: its cache length must be untaken too
        slot = untaken_size(taken, slot + 3) - 1
    feature = torch.zeros(full.architecture.hidden_size, dtype=full.cache.tensors[0].dtype, device=full.device)
    with torch.inference_mode():
        early.step(0, slot, feature, force_exit=early.layerwise.scored_layers[0])
        if early.finishing is not None:   # the exited row finishes beside a full step: two rows above the exit
            early.step(0, slot + 1, feature, force_exit=early.layerwise.num_layers - 1)
    early.reset()
    early.take_report()   # the warm-up step is not part of any generation


def warm_up_tree(verifier: HyperTokenVerifier, drafter: TreeDrafter) -> None:
    """Compile the segments for tree rows too (a one-token warm-up compiles them for q = 1 only):
    one throw-away round of the configured tree shape, at a cache length equal to no static size."""
    early, full = verifier.early, verifier.full
    nodes = 1 + drafter.depth * drafter.width
    taken = early.layerwise.static_sizes | set(full.cache.tensors[0].shape) | {nodes, drafter.width}
    prefix = untaken_size(taken, nodes + 2) - nodes
    with torch.inference_mode():
        drafter.follower.valid = prefix   # the head drafts from a prefix it never saw: the warm-up primes nothing
        draft = drafter.propose([0] * (prefix + 1), DraftBudget(drafter.depth, nodes), SamplingConfig(), None)
        verifier.verify_tree(draft, prefix)
        verifier.commit(prefix, [0])
    drafter.follower.reset()
    early.reset()
    verifier.method_report()   # the warm-up round is not part of any generation
