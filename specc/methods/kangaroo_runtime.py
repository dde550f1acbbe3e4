"""Kangaroo's runtime: a drafter over `shallow` + `adapter`, and a target
forward that verifies from stored exit states with `deep`.

Where work happens, per round (root = the last committed token):
- drafting runs the shallow layers once on the root and on each chain token
  it feeds on (writing the target's shallow KV for real, at the token's
  tree slot), stores each exit state, and runs the adapter on it;
- verification runs the shallow layers only on the tree nodes that have no
  stored exit yet (the last drafted token and any siblings), then the deep
  layers on every node from the stored exits. Prefill and plain decoding
  steps are the same call with nothing stored: shallow then deep.
So every token's shallow KV is written exactly once.

The adapter keeps its own KV cache, indexed by position, for committed
tokens and this round's chain. Tokens it has not seen yet (the prompt, and
after full acceptance the last drafted token or an accepted sibling) are
fed to it from their stored exits at the start of the next round: the
catch-up step rides in the same adapter call as the new root.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import torch

from specc.runtime.acceptance import Acceptance
from specc.runtime.cached_model import CachedModel
from specc.runtime.drafter import Draft, DraftBudget
from specc.runtime.masks import causal_chunk_mask
from specc.runtime.sampling import SamplingConfig, probabilities, sample
from specc.runtime.tree import TreeSpec, tree_tensors

if TYPE_CHECKING:
    from specc.methods.kangaroo import KangarooConfig


class ExitStates:
    """The exit hidden state stored for each cache slot, and which slots the
    drafter filled since the last target forward (those skip the shallow layers)."""

    def __init__(self, slots: int, hidden_size: int, dtype: torch.dtype, device="cpu"):
        self.rows = torch.zeros(slots, hidden_size, dtype=dtype, device=device)
        self._fresh: set[int] = set()

    def write(self, slots: torch.Tensor, states: torch.Tensor, fresh: bool) -> None:
        self.rows.index_copy_(0, slots, states)
        if fresh:
            self._fresh.update(slots.tolist())

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        return self.rows.index_select(0, slots)

    def stale(self, slots: torch.Tensor) -> torch.Tensor:
        """Indices (into `slots`) of the rows with no fresh exit state."""
        missing = [i for i, slot in enumerate(slots.tolist()) if slot not in self._fresh]
        return torch.tensor(missing, dtype=torch.long, device=slots.device)

    def forget_fresh(self) -> None:
        self._fresh.clear()

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        """Move accepted tree rows to base + 0, 1, 2, … (as KVCache.commit does for KV)."""
        moves = [(i, off) for i, off in enumerate(accepted_offsets) if off != i]
        if moves:
            dst = torch.tensor([base + i for i, _ in moves], device=self.rows.device)
            src = torch.tensor([base + off for _, off in moves], device=self.rows.device)
            self.rows.index_copy_(0, dst, self.rows.index_select(0, src))


class ShallowOnceThenDeep:
    """The target's forward (`CachedModel` calling convention): the shallow graph on
    the rows without a fresh exit state, then the deep graph on all rows from the
    stored exits. Both write the same cache list, each its own layers."""

    def __init__(self, shallow: Callable, deep: Callable, exits: ExitStates):
        self.shallow = shallow
        self.deep = deep
        self.exits = exits

    def __call__(self, input_ids, position_ids, attn_mask, cache_positions, *caches):
        stale = self.exits.stale(cache_positions)
        if stale.numel():
            (hidden,) = self.shallow(input_ids[:, stale], position_ids[:, stale], attn_mask[:, :, stale],
                                     cache_positions[stale], *caches)
            self.exits.write(cache_positions[stale], hidden[0], fresh=False)
        self.exits.forget_fresh()
        exits = self.exits.read(cache_positions)[None]
        return self.deep(input_ids, position_ids, attn_mask, cache_positions, *caches, exits)


class KangarooDrafter:
    def __init__(self, shallow: CachedModel, adapter: CachedModel, exits: ExitStates, config: KangarooConfig):
        self.shallow = shallow
        self.adapter = adapter
        self.exits = exits
        self.config = config
        self.adapter_len = 0   # positions whose adapter KV is valid
        self._root = 0         # slot of the root of the last draft
        self._fed = 0          # chain tokens of the last draft that went through the adapter

    def begin(self, prompt: torch.Tensor) -> None:
        self.adapter_len = 0
        self.exits.forget_fresh()

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        config = self.config
        max_depth = min(config.max_draft_steps, budget.max_depth, budget.max_nodes - 1)
        if max_depth < 1:
            return None
        root = len(tokens) - 1
        sampled_chain = not sampling.greedy and config.tree_width == 1
        logits = self._catch_up_and_root(tokens, root)
        node_tokens, widths, draft_probs, chain_slots = [tokens[-1]], [], [], [root]
        for depth in range(1, max_depth + 1):
            probs = _draft_distribution(logits, sampling)
            confidence = float(probs.max())
            slot = root + len(node_tokens)
            if sampled_chain:
                level = [sample(probs, generator)]
                draft_probs.append(probs)
            else:
                width = config.tree_width if confidence < config.tree_threshold else 1
                level = probs.topk(min(width, budget.max_nodes - len(node_tokens))).indices.tolist()
            node_tokens += level
            widths.append(len(level))
            if depth == max_depth or confidence < config.exit_threshold or len(node_tokens) >= budget.max_nodes:
                break
            chain_slots.append(slot)
            logits = self._feed_chain_token(level[0], root + depth, chain_slots)
        self._root, self._fed = root, len(chain_slots) - 1
        device = self.shallow.device
        return Draft(
            tree=tree_tensors(TreeSpec(tuple(widths))),
            node_tokens=torch.tensor(node_tokens, device=device),
            draft_probs=torch.stack(draft_probs) if sampled_chain else None,
        )

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        self.exits.commit(self._root, acceptance.path)
        chain_accepted = 0
        for node, chain_node in zip(acceptance.path[1:], draft.tree.chain_nodes):
            if node != chain_node:
                break
            chain_accepted += 1
        self.adapter_len = self._root + 1 + min(chain_accepted, self._fed)

    def warm_up(self, target: CachedModel) -> None:
        """Compile (Inductor) every graph at the shapes the loop uses: a chunk and a
        single token through the target (shallow then deep) and through the adapter."""
        device = self.shallow.device
        with torch.inference_mode():
            for start, length in ((0, 3), (3, 1)):
                tokens = torch.zeros(length, dtype=torch.long, device=device)
                target.extend(tokens, start)
                positions = torch.arange(start, start + length, device=device)
                self.adapter.run_all(tokens, positions, positions, causal_chunk_mask(start, length, device),
                                     self.exits.read(positions)[None])
        for model in (target, self.shallow, self.adapter):
            model.forward_passes = 0

    def _catch_up_and_root(self, tokens: list[int], root: int) -> torch.Tensor:
        """Shallow layers on the root; adapter on every position it has not seen, root last."""
        device = self.shallow.device
        root_slot = torch.tensor([root], device=device)
        (hidden,) = self.shallow.run_all(torch.tensor(tokens[-1:], device=device), root_slot, root_slot,
                                         causal_chunk_mask(root, 1, device))
        self.exits.write(root_slot, hidden[0], fresh=True)
        start = self.adapter_len
        positions = torch.arange(start, root + 1, device=device)
        (logits,) = self.adapter.run_all(torch.tensor(tokens[start:], device=device), positions, positions,
                                         causal_chunk_mask(start, root + 1 - start, device),
                                         self.exits.read(positions)[None])
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
        self.exits.write(slot_t, hidden[0], fresh=True)
        (logits,) = self.adapter.run_all(token_t, position_t, position_t, causal_chunk_mask(position, 1, device),
                                         hidden)
        return logits[0, -1]


def _draft_distribution(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """What the adapter proposes from: the sampling distribution, or softmax for greedy
    (whose top-1 probability is the confidence the exit threshold reads)."""
    if sampling.greedy:
        return torch.softmax(logits.float(), dim=-1)
    return probabilities(logits, sampling)


def build_runtime(shallow: CachedModel, deep: Callable, adapter: Callable, max_seq_len: int,
                  dtype: torch.dtype, config: KangarooConfig) -> tuple[CachedModel, KangarooDrafter]:
    """The target model the loop verifies with, and the drafter, over three graphs.

    `shallow` owns the target's KV cache; the target shares it. The adapter
    gets a one-layer cache of its own.
    """
    arch = shallow.architecture
    exits = ExitStates(max_seq_len + 1, arch.hidden_size, dtype, shallow.device)
    target = CachedModel(ShallowOnceThenDeep(shallow.forward_fn, deep, exits), arch, max_seq_len, dtype,
                         shallow.device, cache=shallow.cache)
    adapter_model = CachedModel(adapter, replace(arch, num_layers=1), max_seq_len, dtype, shallow.device)
    return target, KangarooDrafter(shallow, adapter_model, exits, config)
