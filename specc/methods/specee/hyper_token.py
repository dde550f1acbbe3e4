"""SpecEE's tree mode: each path of a drafted token tree leaves the target as one hyper-token.

Drafting (`draft_tree`, EAGLE-2-style): the draft head runs on the root
with the last committed token's feature; each level's nodes are the
`width` best of the previous level's nodes' top-`width` children by
cumulative draft log-probability, fed the head's own block output at
their parent as the feature (the target's is not known yet). The head
runs once more on the leaves, so every node has its top-K candidates for
the exit predictors. A tree of depth D holds 1 + D·width nodes: a static
size, whatever its shape.

Verification (`HyperTokenVerifier`): the flattened tree (tree mask,
positions prefix + depth) steps through the layer-wise target. After a
scheduled layer, a node still running whose predictor fires gets the
guard (the full head's argmax at that layer is one of its candidates);
once it passes, that node may exit. A path (a hyper-token, the paper's
§6.2) leaves at the first layer where every node on it may exit, with
the logits and states of its nodes at that layer: the deepest exit any
of its tokens needs. Nodes no remaining path holds stop running (they are
never an ancestor of a running node, so nothing running attends to their
missing rows); the forward ends when every path has left or after the top
layer, where the remaining paths leave with the full model's logits.

Acceptance (greedy): on each path, the longest prefix whose every token
is the argmax of its parent's logits at that path's exit layer; the
first rejected position gets that argmax as the bonus token. The longest
accepted path wins (the first such path on ties). Commit moves the
accepted rows to contiguous slots; the K/V of the layers above each
accepted node's last layer follow `kv_policy` as in `ar` mode (propagated
from the node's state there, or masked for later tokens). With no exits
every path runs every layer and this is plain greedy tree verification.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget
from specc.contract.sampling import SamplingConfig
from specc.contract.side_channel import SideChannel, carried
from specc.contract.tree import TreeTensors, tree_from_parents
from specc.contract.verification import Acceptance, Verification
from specc.errors import UsageError
from specc.methods.specee.early_exit import FEATURE, DraftHead, EarlyExit, FollowsAcceptedTokens
from specc.runtime.cached_model import CachedModel
from specc.runtime.draft_follower import DraftFollower
from specc.runtime.masks import apply_sliding_window, tree_mask

@dataclass(frozen=True)
class ExitCandidates(SideChannel):
    """What a tree draft carries to the verifier: each node's draft-head top-K ids, which the
    exit guard checks the target's argmax against."""

    ids: torch.Tensor     # [n, K]


def draft_tree(head: DraftHead, root: int, slot: int, feature: torch.Tensor, depth: int,
               width: int) -> tuple[torch.Tensor, TreeTensors, torch.Tensor]:
    """(node tokens [n], the tree, each node's top-K candidates [n, K]) for a root at `slot` after
    the previous token's `feature` [hidden]; writes the head's K/V at the tree's slots."""
    device = head.model.device
    n = 1 + depth * width
    allowed = torch.zeros(n, slot + n, dtype=torch.bool, device=device)   # prefix + ancestors
    allowed[:, :slot] = True
    allowed[0, slot] = True
    tokens, parent, score = [root], [-1], torch.zeros(1, device=device)
    level, features, candidates = [0], feature[None], []
    for d in range(depth + 1):
        rows = torch.tensor(level, device=device)
        positions = torch.full((len(level),), slot + d, device=device)
        out = head.model.run(torch.tensor([tokens[i] for i in level], device=device), positions, slot + rows,
                             allowed[rows][None, None], features[None])
        candidates.append(head.to_vocabulary(out.logits.topk(head.k, dim=-1).indices))
        if d == depth:
            break
        top = torch.log_softmax(out.logits.float(), dim=-1).topk(width, dim=-1)
        best = (score[:, None] + top.values).flatten().topk(width)
        chosen_parent, chosen_child = best.indices // width, best.indices % width
        ids = head.to_vocabulary(top.indices[chosen_parent, chosen_child])
        level_start = len(tokens)
        for k, (p, token) in enumerate(zip(chosen_parent.tolist(), ids.tolist())):
            node = level_start + k
            tokens.append(token)
            parent.append(level[p])
            allowed[node] = allowed[level[p]]
            allowed[node, slot + node] = True
        score, features = best.values, out.outputs[FEATURE][chosen_parent]
        level = list(range(level_start, len(tokens)))
    return torch.tensor(tokens, device=device), tree_from_parents(tuple(parent)), torch.cat(candidates)


@dataclass
class _Round:
    """What commit needs from the last tree verification."""

    tokens: torch.Tensor          # [n]
    candidates: torch.Tensor      # [n, K]
    last_layer: list[int]         # the deepest layer each node ran
    last_hidden: torch.Tensor     # [n, hidden]: its state there


class HyperTokenVerifier:
    """Tree mode's target: the prompt (and a lone last token) run the full model; a drafted tree
    steps through the layer-wise target, each path leaving at its hyper-token exit."""

    capabilities = Capabilities(reports=True)

    def __init__(self, full: CachedModel, early: EarlyExit):
        self.full = full
        self.early = early
        self.device = full.device
        self.architecture = full.architecture
        self.path_exit_layers: list[int] = []   # each round's accepted path's exit layer
        self._round: _Round | None = None

    @property
    def max_seq_len(self) -> int:
        return self.full.max_seq_len

    def prefill(self, tokens: torch.Tensor, start: int) -> Verification:
        if start == 0:
            self.early.reset()
        verification = self.full.prefill(tokens, start)
        self.early.written_by_full_model(verification.slots)
        return verification

    def method_report(self) -> dict:
        """Per round, the layers the tree forward ran (`layers_executed`) and the accepted path's."""
        report = self.early.take_report()
        exits, self.path_exit_layers = [layer + 1 for layer in self.path_exit_layers], []
        report["tree_rounds"] = report.pop("early_exit_steps")
        report["accepted_path_layers"] = exits
        report["mean_accepted_path_layers"] = round(sum(exits) / len(exits), 3) if exits else None
        return report

    def verify_tree(self, draft: Draft, prefix_len: int) -> Verification:
        """One layer-stepped forward over the tree's running rows; paths leave as hyper-tokens."""
        tree, tokens, candidates = draft.tree, draft.node_tokens, carried(draft, ExitCandidates).ids
        n, early, layerwise = tokens.numel(), self.early, self.early.layerwise
        top = layerwise.num_layers - 1
        positions = tree.depth.to(self.device) + prefix_len
        slots = torch.arange(prefix_len, prefix_len + n, device=self.device)
        mask = apply_sliding_window(tree_mask(prefix_len, tree).to(self.device), positions,
                                    self.architecture.sliding_window)
        early.missing[:, prefix_len:prefix_len + n] = False

        def inputs_of(rows: list[int]) -> tuple:
            index = torch.tensor(rows, device=self.device)
            return (tokens[index][None], positions[index][None], mask[:, :, index].contiguous(), slots[index],
                    *early.cache.tensors, candidates[index])

        scheduled = early.schedule.layers()
        rows, inputs, hidden = list(range(n)), inputs_of(list(range(n))), None
        env = layerwise.begin(inputs)
        may_exit = [False] * n
        running = list(range(len(tree.paths)))
        exit_layer: dict[int, int] = {}
        path_logits: dict[int, torch.Tensor] = {}
        path_hidden: dict[int, torch.Tensor] = {}
        last_layer = [0] * n
        last_hidden = torch.empty(n, self.architecture.hidden_size, dtype=early.cache.tensors[0].dtype,
                                  device=self.device)
        for layer in range(top + 1):
            layer_mask = early.layer_mask(layer, inputs[2])
            hidden, score = layerwise.layer(env, layer, hidden, layer_mask)
            last_hidden[rows] = hidden[0]
            for r in rows:
                last_layer[r] = layer
            logits: dict[int, torch.Tensor] = {}
            if layer < top:
                if score is None or layer not in scheduled:
                    continue
                fired = [k for k, r in enumerate(rows) if not may_exit[r] and float(score[0, k, 0]) > early.threshold]
                if not fired:
                    continue
                checked = layerwise.head(hidden[:, fired], inputs)[0]
                early.guard_checks += len(fired)
                for k, row_logits in zip(fired, checked):
                    logits[rows[k]] = row_logits
                    may_exit[rows[k]] = bool((candidates[rows[k]] == row_logits.argmax()).any())
            leaving = [p for p in running if layer == top or all(may_exit[r] for r in tree.paths[p])]
            if not leaving:
                continue
            needed = sorted({r for p in leaving for r in tree.paths[p]} - logits.keys())
            if needed:
                position = {r: k for k, r in enumerate(rows)}
                computed = layerwise.head(hidden[:, [position[r] for r in needed]], inputs)[0]
                logits.update(zip(needed, computed))
            for p in leaving:
                exit_layer[p] = layer
                path_logits[p] = torch.stack([logits[r] for r in tree.paths[p]])
                path_hidden[p] = last_hidden[list(tree.paths[p])].clone()
            running = [p for p in running if p not in exit_layer]
            still = sorted({r for p in running for r in tree.paths[p]})
            if not still:
                break
            if still != rows:
                position = {r: k for k, r in enumerate(rows)}
                hidden = hidden[:, [position[r] for r in still]]
                rows, inputs = still, inputs_of(still)
                env = layerwise.begin(inputs)
        early.exit_layers.append(max(exit_layer.values()))
        acceptance, best = accept_paths(tree, tokens, path_logits)
        early.schedule.record(exit_layer[best])
        self.path_exit_layers.append(exit_layer[best])
        self._round = _Round(tokens, candidates, last_layer, last_hidden)
        return self._verification(tree, slots, path_logits, path_hidden, best, acceptance)

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        """Move the accepted rows, then give the layers above each one's last layer its K/V policy."""
        self.full.commit(base, accepted_offsets)
        done, self._round = self._round, None
        if done is None:
            return
        layerwise, top = self.early.layerwise, self.early.layerwise.num_layers - 1
        destination = torch.arange(base, base + len(accepted_offsets), device=self.device)
        last = [done.last_layer[node] for node in accepted_offsets]
        if layerwise.kv_policy == "mask":
            self.early.missing[:, destination] = False
            for slot, layer in zip(destination.tolist(), last):
                self.early.missing[layer + 1:, slot] = True
            return
        for layer in sorted(set(last) - {top}):
            picked = [k for k, l in enumerate(last) if l == layer]
            nodes = torch.tensor([accepted_offsets[k] for k in picked], device=self.device)
            slots = destination[picked]
            mask = torch.ones(1, 1, len(picked), base + len(accepted_offsets), dtype=torch.bool, device=self.device)
            inputs = (done.tokens[nodes][None], slots[None], mask, slots, *self.early.cache.tensors,
                      done.candidates[nodes])
            layerwise.propagate(inputs, layer, done.last_hidden[nodes][None])

    def _verification(self, tree: TreeTensors, slots, path_logits, path_hidden, best, acceptance) -> Verification:
        """Each node's row read at one path's exit (the accepted path's for its nodes)."""
        n = slots.numel()
        logits = torch.empty(n, path_logits[best].shape[-1], dtype=path_logits[best].dtype, device=self.device)
        features = torch.empty(n, path_hidden[best].shape[-1], dtype=path_hidden[best].dtype, device=self.device)
        for p in [*(p for p in path_logits if p != best), best]:
            nodes = list(tree.paths[p])
            logits[nodes], features[nodes] = path_logits[p], path_hidden[p]
        return Verification(logits, {FEATURE: features}, slots, acceptance)


def accept_paths(tree: TreeTensors, tokens: torch.Tensor, path_logits: dict[int, torch.Tensor]
                  ) -> tuple[Acceptance, int]:
    """Greedy acceptance on each path against its own exit logits; the longest (first on ties)."""
    ids = tokens.tolist()
    best, best_path, best_next = -1, [0], 0
    for p, nodes in enumerate(tree.paths):
        argmax = path_logits[p].argmax(dim=-1).tolist()
        k = 0
        while k + 1 < len(nodes) and ids[nodes[k + 1]] == argmax[k]:
            k += 1
        if len(best_path) - 1 < k or best < 0:
            best, best_path, best_next = p, list(nodes[:k + 1]), argmax[k]
    return Acceptance(best_path, best_next), best


class TreeDrafter(FollowsAcceptedTokens):
    """Tree mode's drafter: the draft head grows a token tree; the verifier's path states feed it."""

    capabilities = Capabilities()

    def __init__(self, early: EarlyExit, depth: int, width: int, follower: DraftFollower):
        self.early = early
        self.depth = depth
        self.width = width
        self.follower = follower

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        self.follower.begin(prompt, prefill)

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        if not sampling.greedy:
            raise UsageError("specee mode=tree accepts greedily (each path against its own exit layer's "
                             "argmax); sample with mode=lossless or mode=ar, or decode greedily")
        depth = min(self.depth, budget.max_depth, (budget.max_nodes - 1) // self.width)
        if depth < 1:
            return None
        node_tokens, tree, candidates = draft_tree(self.early.head, tokens[-1], len(tokens) - 1,
                                                   self._catch_up(tokens), depth, self.width)
        return Draft(tree, node_tokens, carries=ExitCandidates(candidates))

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        self.follower.observe(draft, acceptance, verification)
