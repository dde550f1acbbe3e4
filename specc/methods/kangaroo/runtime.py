"""Kangaroo's runtime: a target that verifies from layer-l exit states with
`deep`, and a drafter over `shallow` + `adapter`.

Where work happens, per round (root = the last committed token):
- drafting runs the shallow layers once on the root and on each chain token
  it feeds on (writing the target's shallow KV for real, at the token's
  tree slot) and runs the adapter on each exit state; the draft carries
  those exit states to the verifier (`DraftExits`). When the first
  token's confidence is below `skip_threshold` the draft is the root alone,
  so the round is a plain step that still skips the root's shallow layers;
- verification runs the shallow layers only on the tree nodes the draft
  brought no exit state for (the last drafted token and any siblings),
  then the deep layers on every node, and returns every node's exit state
  (the output `EXITS`); prefill and plain steps are the same forward
  with nothing brought. So every token's shallow KV is written exactly once.

The drafter keeps the exit state of every committed position (taken from
each verification) and an adapter KV cache of its own, both followed by a
`DraftFollower`. Positions the adapter has not seen yet (the prompt, and after
full acceptance the last drafted token or an accepted sibling) are fed to it
from their stored exits at the start of the next round, in the same adapter
call as the root. With lookup branches (`specc.engine.composition`) the
drafter is the primary of a composed draft, whose merged tree keeps its nodes'
indices and so its exit states; a draft of another branch's brings none, and
verification runs the shallow layers on all its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget, MethodRuntime
from specc.contract.sampling import SamplingConfig
from specc.contract.side_channel import SideChannel, carried
from specc.contract.tree import TreeSpec, tree_tensors
from specc.contract.verification import Acceptance, Verification
from specc.methods.kangaroo.config import KangarooConfig
from specc.runtime.cached_model import CachedModel, chunk_layout, tree_layout
from specc.runtime.draft_follower import DraftFollower
from specc.runtime.draft_logits import draft_distribution, full_vocabulary, token_ids, vocabulary_from_state
from specc.runtime.masks import causal_chunk_mask
from specc.runtime.sampling import sample

EXITS = "exit_hidden"          # the verifier's output: the exit state of each row run, [q, hidden]


@dataclass(frozen=True)
class DraftExits(SideChannel):
    """What a draft carries to the verifier: the exit states the drafter already computed."""

    states: torch.Tensor     # [k, hidden]
    nodes: torch.Tensor      # [k]: the tree node of each


class ExitVerifier:
    """The target for the loop: shallow layers where no exit state is known, then
    the deep layers on all rows. Both graphs write the same (target) cache."""

    capabilities = Capabilities(resumable=True)   # its one KV cache is all its per-token state

    def __init__(self, shallow: CachedModel, deep: CachedModel):
        self.shallow = shallow
        self.deep = deep
        self.architecture = deep.architecture
        self.device = deep.device
        self.max_seq_len = deep.max_seq_len

    def prefill(self, tokens: torch.Tensor, start: int) -> Verification:
        return self._forward(tokens, *chunk_layout(start, tokens.numel(), self.device), None, last_logits_only=True)

    def verify_tree(self, draft: Draft, prefix_len: int) -> Verification:
        return self._forward(draft.node_tokens, *tree_layout(draft, prefix_len, self.device), carried(draft, DraftExits))

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        self.deep.commit(base, accepted_offsets)

    @property
    def forward_passes(self) -> int:
        """Calls of either graph, which share the cache (the drafter runs the shallow one too)."""
        return self.shallow.forward_passes + self.deep.forward_passes

    def _forward(self, tokens, positions, slots, mask, known: DraftExits | None,
                 last_logits_only: bool = False) -> Verification:
        exits = torch.empty(tokens.numel(), self.architecture.hidden_size, dtype=self.deep.cache.tensors[0].dtype,
                            device=self.device)
        missing = torch.ones(tokens.numel(), dtype=torch.bool, device=self.device)
        if known is not None:
            exits[known.nodes] = known.states
            missing[known.nodes] = False
        stale = missing.nonzero().flatten()
        if stale.numel():
            (hidden,) = self.shallow.run_all(tokens[stale], positions[stale], slots[stale], mask[:, :, stale])
            exits[stale] = hidden[0]
        verification = self.deep.run(tokens, positions, slots, mask, exits[None], last_logits_only=last_logits_only)
        verification.outputs[EXITS] = exits
        return verification


class KangarooDrafter:
    # The adapter's progress and the exits are a DraftFollower's, read from the draft it is shown;
    # after a reused prefix the adapter's KV and the exits it kept still hold there.
    capabilities = Capabilities(resumable=True, composable=True)

    def __init__(self, shallow: CachedModel, adapter: CachedModel, config: KangarooConfig,
                 vocabulary: torch.Tensor | None = None):
        """`vocabulary`: the token id of each row of a reduced draft head (None: the full head)."""
        self.shallow = shallow
        self.adapter = adapter
        self.config = config
        self.vocabulary = vocabulary
        self.vocab_size = shallow.architecture.vocab_size
        # The exit state of every committed position, and how far the adapter's KV follows them.
        self.follower = DraftFollower(shallow.max_seq_len, shallow.device, EXITS, shallow.architecture.hidden_size,
                                      shallow.cache.tensors[0].dtype)
        self._chain_exits: list[torch.Tensor] = []

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        self.follower.begin(prompt, prefill)

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        config = self.config
        max_depth = min(config.max_draft_steps, budget.max_depth, budget.max_nodes - 1)
        if max_depth < 1:
            return None
        root = len(tokens) - 1
        sampled_chain = not sampling.greedy and (config.tree_width == 1 or budget.chain_only)
        logits = self._catch_up_and_root(tokens, root)
        node_tokens, widths, draft_probs, chain_slots = [tokens[-1]], [], [], [root]
        for depth in range(1, max_depth + 1):
            probs = draft_distribution(logits, sampling)
            confidence = float(probs.max())
            if depth == 1 and confidence < config.skip_threshold:
                break   # a root-only draft: verification still reuses the root's exit state
            slot = root + len(node_tokens)
            if sampled_chain:
                level = token_ids(torch.tensor([sample(probs, generator)]), self.vocabulary)
                draft_probs.append(full_vocabulary(probs, self.vocabulary, self.vocab_size))
            else:
                width = config.tree_width if confidence < config.tree_threshold and not budget.chain_only else 1
                level = token_ids(probs.topk(min(width, budget.max_nodes - len(node_tokens))).indices,
                                  self.vocabulary)
            node_tokens += level
            widths.append(len(level))
            if depth == max_depth or confidence < config.exit_threshold or len(node_tokens) >= budget.max_nodes:
                break
            chain_slots.append(slot)
            logits = self._feed_chain_token(level[0], root + depth, chain_slots)
        device = self.shallow.device
        slots = torch.tensor(chain_slots, device=device)
        return Draft(
            tree=tree_tensors(TreeSpec(tuple(widths))),
            node_tokens=torch.tensor(node_tokens, device=device),
            draft_probs=torch.stack(draft_probs) if sampled_chain and draft_probs else None,
            carries=DraftExits(torch.stack(self._chain_exits), slots - root),
        )

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        self.follower.observe(draft, acceptance, verification)

    def _catch_up_and_root(self, tokens: list[int], root: int) -> torch.Tensor:
        """Shallow layers on the root; adapter on every position it has not seen, root last."""
        device = self.shallow.device
        root_slot = torch.tensor([root], device=device)
        (hidden,) = self.shallow.run_all(torch.tensor(tokens[-1:], device=device), root_slot, root_slot,
                                         causal_chunk_mask(root, 1, device))
        self.follower.set_feature(root, hidden[0, 0])
        self._chain_exits = [hidden[0, 0]]   # exit states of the root and each chain token fed, in order
        start = self.follower.valid
        positions = torch.arange(start, root + 1, device=device)
        (logits,) = self.adapter.run_all(torch.tensor(tokens[start:], device=device), positions, positions,
                                         causal_chunk_mask(start, root + 1 - start, device),
                                         self.follower.feature_of(positions)[None])
        self.follower.caught_up(root)
        return logits[0, -1]

    def _feed_chain_token(self, token: int, position: int, chain_slots: list[int]) -> torch.Tensor:
        """Shallow layers at the token's tree slot (seeing the prefix and its chain
        ancestors), then the adapter at its position; returns the next logits."""
        device = self.shallow.device
        slot = chain_slots[-1]
        mask = torch.zeros(1, 1, 1, slot + 1, dtype=torch.bool, device=device)
        mask[..., :chain_slots[0]] = True
        mask[..., chain_slots] = True
        token_t = torch.tensor([token], device=device)
        slot_t = torch.tensor([slot], device=device)
        position_t = torch.tensor([position], device=device)
        (hidden,) = self.shallow.run_all(token_t, position_t, slot_t, mask)
        self._chain_exits.append(hidden[0, 0])
        (logits,) = self.adapter.run_all(token_t, position_t, position_t, causal_chunk_mask(position, 1, device),
                                         hidden)
        self.follower.fed(token)
        return logits[0, -1]


def build_runtime(context, config: KangarooConfig) -> MethodRuntime:
    """`shallow` owns the target's KV cache and `deep` shares it; the adapter
    has a one-layer cache of its own."""
    shallow = context.model("shallow")
    deep = context.model("deep", cache=shallow.cache)
    vocabulary = vocabulary_from_state(context.state, shallow.device)
    return MethodRuntime(ExitVerifier(shallow, deep),
                         KangarooDrafter(shallow, context.model("adapter"), config, vocabulary))
