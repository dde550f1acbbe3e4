"""Eagle's runtime: the plain target verifies (returning each row's fused feature), and a
drafter grows an EAGLE-2 dynamic tree with the draft head.

Per round (root = the last committed token, at position r):
- catch-up: the head runs on every position it has not seen, root last, in one call: the
  token at p with the target's feature of p - 1 (committed positions always read the
  target's features, as the head was trained). Its last row gives the root's candidates
  and the head's own hidden state there, and only that row goes through the head's LM head
  (after lookup copied a span, a catch-up has dozens of rows);
- growth (EAGLE-2): at each depth the `tree_width` best nodes by cumulative draft
  log-probability are expanded, in one head call, each with its parent's head hidden state
  as the feature (the target's is not known yet) and attending to the prefix and its own
  expanded ancestors; each offers its `tree_width` best children;
- growth stops early once even the likeliest candidate of the newest depth has a cumulative
  draft probability below `stop_probability`: a further head call would rarely pay for itself;
- selection: the `tree_nodes` best candidates by cumulative log-probability form the tree
  (a child never scores above its parent, so the best set keeps every node's ancestors),
  ordered by depth then score, so each node's first child is its best and the first-child
  path is the greedy chain that chain-only budgets keep.

Under a chain-only budget (bfloat16 engines verify only exact chains) the tree is a chain:
width 1, as many steps as the budget's rows allow. Drafts are deterministic, so sampling
stays exact through the loop's point-mass acceptance.

What the head has seen and the target's features it reads are a `DraftFollower`'s, which
reads each round from the draft it is shown, so the drafter composes with other drafters
in one tree (`specc.runtime.compose`; `lookup=true` and `lookup_corpus`:
`specc.engine.composition`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget, MethodRuntime
from specc.contract.sampling import SamplingConfig
from specc.contract.tree import tree_from_parents
from specc.methods.eagle.attach_eagle_head import HIDDEN_OUTPUT
from specc.methods.eagle.config import EagleConfig
from specc.methods.eagle.expose_fused_features import FEATURE_OUTPUT
from specc.runtime.cached_model import CachedModel
from specc.runtime.draft_follower import DraftFollower, catch_up_rows
from specc.runtime.draft_logits import draft_distribution, token_ids, vocabulary_from_state
from specc.runtime.masks import causal_chunk_mask


@dataclass
class _Growth:
    """The candidate pool of one round: node 0 is the root."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]          # cumulative log draft probability
    probs: list[float]           # draft probability given the parent
    depths: list[int]
    slots: dict[int, int] = field(default_factory=dict)   # head cache slot of every expanded node
    rows: dict[int, int] = field(default_factory=dict)    # row of each node in the last head call's output

    def add(self, parent: int, token: int, prob: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.probs.append(prob)
        self.scores.append(self.scores[parent] + _log(prob))
        self.depths.append(self.depths[parent] + 1)
        return len(self.tokens) - 1

    def hidden_row(self, node: int) -> int:
        """Row of `node`'s head hidden state in the last head call's output (the root's: row 0
        of the catch-up call)."""
        return 0 if node == 0 else self.rows[node]

    def ancestors(self, node: int) -> list[int]:
        chain = []
        while node > 0:
            chain.append(node)
            node = self.parents[node]
        return chain


class EagleDrafter:
    # What the head has seen is a DraftFollower's, read from the draft it is shown; after a reused
    # prefix the head's KV and the features it kept still hold there.
    capabilities = Capabilities(resumable=True, composable=True)

    def __init__(self, head: CachedModel, config: EagleConfig, vocabulary: torch.Tensor | None,
                 hidden_size: int, dtype: torch.dtype):
        self.head = head
        self.config = config
        self.vocabulary = vocabulary
        self.device = head.device
        # The head reads the token at position p with the target's fused feature of position p - 1.
        self.follower = DraftFollower(head.max_seq_len, head.device, FEATURE_OUTPUT, hidden_size, dtype)
        self._log_stop = _log(config.stop_probability) if config.stop_probability > 0 else -math.inf

    def begin(self, prompt: torch.Tensor, prefill) -> None:
        self.follower.begin(prompt, prefill)

    def observe(self, draft: Draft | None, acceptance, verification) -> None:
        self.follower.observe(draft, acceptance, verification)

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        config = self.config
        width = 1 if budget.chain_only else config.tree_width
        nodes = min(budget.max_nodes - 1, config.depth if width == 1 else config.tree_nodes)
        depth = min(config.depth, budget.max_depth, nodes)
        if depth < 1:
            return None
        root = len(tokens) - 1
        logits, hidden = self._catch_up(tokens, root)
        growth = _Growth([tokens[-1]], [-1], [0.0], [1.0], [0])
        frontier = [0]
        for level in range(1, depth + 1):
            children = self._offer(growth, frontier, logits, width, sampling)
            if level == depth or self._unsure(growth, children):
                break
            frontier = sorted(children, key=lambda n: -growth.scores[n])[:width]
            logits, hidden = self._expand(growth, frontier, hidden, root, level)
        return self._select(growth, nodes)

    def _unsure(self, growth: _Growth, children: list[int]) -> bool:
        """Whether even the likeliest of the newest candidates is below `stop_probability`."""
        return max(growth.scores[n] for n in children) < self._log_stop

    def _catch_up(self, tokens: list[int], root: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head on the positions it has not seen, root last; the root's logits [1, V'] and
        hidden state [1, H]. The call's rows are `catch_up_rows` of them, the root's row repeated:
        a repeated row has the root's token, position, slot, mask row and feature, so it writes
        the root's K/V again, and its outputs are the root's. The K/V the head writes while the
        tree grows is never kept: committed positions are always read with the target's features,
        as the head was trained."""
        start = self.follower.valid
        count = root + 1 - start
        rows = torch.arange(catch_up_rows(count), device=self.device).clamp(max=count - 1)
        positions = rows + start
        out = self.head.run(torch.tensor(tokens[start:], device=self.device)[rows], positions, positions,
                            causal_chunk_mask(start, count, self.device)[:, :, rows],
                            self.follower.feature_before(positions)[None], last_logits_only=True)
        self.follower.caught_up(root)
        return out.logits, out.outputs[HIDDEN_OUTPUT][-1:]

    def _offer(self, growth: _Growth, frontier: list[int], logits: torch.Tensor, width: int,
               sampling: SamplingConfig) -> list[int]:
        """Each frontier node's `width` best children, added to the pool."""
        top = draft_distribution(logits, sampling).topk(width, dim=-1)
        children = []
        for row, parent in enumerate(frontier):
            ids = token_ids(top.indices[row], self.vocabulary)
            for token, prob in zip(ids, top.values[row].tolist()):
                children.append(growth.add(parent, token, prob))
        return children

    def _expand(self, growth: _Growth, frontier: list[int], parent_hidden: torch.Tensor, root: int,
                level: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One head call on the frontier nodes (depth `level`): each reads its parent's hidden state
        and attends to the prefix, its expanded ancestors and itself."""
        parent_rows = [growth.hidden_row(growth.parents[n]) for n in frontier]
        for node in frontier:
            growth.slots[node] = root + 1 + len(growth.slots)
        slots = torch.tensor([growth.slots[n] for n in frontier], device=self.device)
        mask = torch.zeros(len(frontier), int(slots.max()) + 1, dtype=torch.bool, device=self.device)
        mask[:, : root + 1] = True
        for row, node in enumerate(frontier):
            mask[row, [growth.slots[a] for a in growth.ancestors(node)]] = True
        positions = torch.full((len(frontier),), root + level, device=self.device)
        out = self.head.run(torch.tensor([growth.tokens[n] for n in frontier], device=self.device), positions,
                            slots, mask[None, None], parent_hidden[parent_rows][None])
        growth.rows = {node: row for row, node in enumerate(frontier)}
        return out.logits, out.outputs[HIDDEN_OUTPUT]

    def _select(self, growth: _Growth, nodes: int) -> Draft:
        """The `nodes` best candidates, ancestors first; ordered by depth, then score."""
        ranked = sorted(range(1, len(growth.tokens)), key=lambda n: (-growth.scores[n], growth.depths[n]))
        kept: set[int] = set()
        for node in ranked:
            if len(kept) == nodes:
                break
            if growth.parents[node] == 0 or growth.parents[node] in kept:
                kept.add(node)
        order = [0] + sorted(kept, key=lambda n: (growth.depths[n], -growth.scores[n]))
        index = {node: i for i, node in enumerate(order)}
        parents = tuple(-1 if n == 0 else index[growth.parents[n]] for n in order)
        return Draft(tree=tree_from_parents(parents),
                     node_tokens=torch.tensor([growth.tokens[n] for n in order], device=self.device),
                     node_scores=torch.tensor([growth.probs[n] for n in order]))


def _log(prob: float) -> float:
    return math.log(max(prob, 1e-30))


def build_runtime(context, config: EagleConfig) -> MethodRuntime:
    """The target verifies as is (its extra output is each row's fused feature); the head has
    a one-layer cache of its own."""
    target = context.model("target")
    head = context.model("head")
    vocabulary = vocabulary_from_state(context.state, target.device)
    return MethodRuntime(target, EagleDrafter(head, config, vocabulary, target.architecture.hidden_size,
                                              target.cache.tensors[0].dtype))
