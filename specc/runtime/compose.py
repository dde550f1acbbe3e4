"""Several drafters proposing into one tree: `ComposedDrafter`.

Every round each branch drafts with the same budget, and their drafts are
merged as a trie under the shared root: a branch's node whose path of tokens
another branch already drafted is that node, any other node is new. The
target verifies the merged tree once, so a round accepts the longest path
any branch offered (greedy), and a lookup drafter's long copied spans ride
along with a model drafter's guesses at no extra target call. The primary
branch (the first) keeps its whole draft and node order; the others' new
nodes follow by depth, as many as `DraftBudget.max_nodes` leaves room for.
So the primary's side channel (`Draft.carries`: what its method's own target reads,
indexed by its nodes) still names the same nodes, and the verified draft keeps them
whenever the primary's nodes are in it; the other branches draft tokens alone.

Two kinds of draft are not merged:
- Under `DraftBudget.chain_only` (engines whose verification is exact for
  chains only) one branch's chain (`exact_chain`) is verified: the one with
  the larger expected accepted length, sum over depths d of the product of
  the acceptance estimates of depths 1..d. A branch's estimates are its
  `Draft.node_scores` where it gives them, else its acceptance per depth
  measured in this engine so far. Ties go to the primary. Branches are then
  asked cheapest first (`draft_cost`), and a costlier one is not asked at
  all in a round where a chain already drafted promises more than that
  branch's measured acceptance delivers per round: a model drafter is
  spared when the lookup has copied a span that has been holding.
- A sampled chain (`Draft.draft_probs`) is verified alone, the first
  branch's that returns one: its Leviathan acceptance needs the q every
  node was drawn from, which other branches' nodes do not have.

The contract a branch keeps (a drafter declares it in its capabilities,
`Capabilities(composable=True)`, and only such drafters are taken): `observe` shows every
branch the same round, the draft the target verified (merged, or another
branch's chain), its acceptance and its verification, not the draft the
branch proposed. A branch that learns from rounds reads them from the draft
it is shown: the accepted tokens are `draft.node_tokens[acceptance.path]`,
and verification rows are indexed by that draft's nodes, never by indices
into its own proposal (`specc.runtime.draft_follower` keeps such state for
model-backed drafters). Only the primary's drafts may carry a side channel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget, Drafter, declared_capabilities
from specc.contract.sampling import SamplingConfig
from specc.contract.tree import tree_from_parents
from specc.contract.verification import Acceptance, Verification
from specc.errors import SpeccError, UsageError
from specc.runtime.exact_chain import exact_chain

# The acceptance a depth is credited with before it has been tried, and the weight of that
# guess: one try, so a single early round does not decide a branch's estimate alone.
PRIOR_ACCEPTANCE = 0.5


@dataclass
class BranchCounts:
    """One branch's share of the rounds since the last `method_report`. A node several
    branches drafted counts for each of them."""

    accepted_tokens: int = 0   # accepted nodes the branch had drafted
    proposed_tokens: int = 0   # verified nodes the branch had drafted
    rounds_chosen: int = 0     # rounds whose verified draft held some of its nodes (chain_only: its chain)
    rounds_drafted: int = 0    # rounds it returned a draft in
    rounds_skipped: int = 0    # chain-only rounds it was not asked in: a cheaper branch's chain promised more


@dataclass
class DepthAcceptance:
    """How often a branch's chain was accepted at each depth, given the depths above it
    were: matched against the tokens the target emitted (accepted, then the bonus)."""

    accepted: list[int] = field(default_factory=list)
    tried: list[int] = field(default_factory=list)

    def rate(self, depth: int) -> float:
        """The estimate for `depth` (1 = the root's child)."""
        if depth > len(self.tried):
            return PRIOR_ACCEPTANCE
        return (self.accepted[depth - 1] + PRIOR_ACCEPTANCE) / (self.tried[depth - 1] + 1)

    def record(self, chain: list[int], emitted: list[int]) -> None:
        """Depth d is tried when the target emitted a token there (d <= len(emitted)) and the
        chain matched every depth above it; accepted when its token is the emitted one."""
        for index, token in enumerate(chain[:len(emitted)]):
            if index == len(self.tried):
                self.accepted.append(0)
                self.tried.append(0)
            self.tried[index] += 1
            if token != emitted[index]:
                return
            self.accepted[index] += 1


@dataclass(frozen=True)
class _Chain:
    """A branch's chain under `chain_only` and its expected accepted length."""

    draft: Draft
    promise: float


@dataclass
class _Round:
    drafts: dict[str, Draft]     # what each drafting branch proposed
    chosen: tuple[str, ...]      # the branches whose drafts went into the verified one


class ComposedDrafter:
    """`branches` (ordered, the first is the primary) draft into one tree; see the module
    docstring. `method_report()` says which branch the accepted tokens came from."""

    def __init__(self, branches: dict[str, Drafter]):
        if not branches:
            raise UsageError("ComposedDrafter needs at least one branch drafter")
        for name, drafter in branches.items():
            declared = declared_capabilities(drafter)
            if declared is None or not declared.composable:
                raise UsageError(
                    f"branch {name!r} ({type(drafter).__name__}) is not composable: a composed drafter shows "
                    f"every branch the merged draft in observe, not its own. Declare it composable on its "
                    f"class (`capabilities = Capabilities(composable=True)`) once its observe reads each round "
                    f"from the draft it is shown "
                    f"(see specc.runtime.compose)")
        self.branches = dict(branches)
        self.primary = next(iter(branches))
        # It reads rounds by tokens, as it asks its branches to; it may begin after a reused
        # prefix when every branch may.
        self.capabilities = Capabilities(
            resumable=all(drafter.capabilities.resumable for drafter in branches.values()), composable=True,
            draft_cost=sum(drafter.capabilities.draft_cost for drafter in branches.values()), reports=True)
        self.measured = {name: DepthAcceptance() for name in branches}
        self.counts = {name: BranchCounts() for name in branches}
        self.accepted_tokens = 0
        self._round: _Round | None = None

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        self._round = None
        for drafter in self.branches.values():
            drafter.begin(prompt, prefill)

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        drafts, chains = self._branch_drafts(tokens, budget, sampling, generator)
        draft, chosen = self._compose(drafts, chains, budget)
        self._round = None if draft is None else _Round(drafts, chosen)
        return draft

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        """Every branch sees the verified round; then the branches' shares and measured
        acceptance are updated from it."""
        for drafter in self.branches.values():
            drafter.observe(draft, acceptance, verification)
        round_, self._round = self._round, None
        if draft is None or acceptance is None or round_ is None:
            return
        self._attribute(round_, draft, acceptance.path)
        accepted = acceptance.accepted_tokens
        if accepted is None:
            accepted = draft.node_tokens[acceptance.path[1:]].tolist()
        emitted = [*accepted, acceptance.next_token]
        for name, proposed in round_.drafts.items():
            self.measured[name].record(chain_tokens(proposed), emitted)
        self.accepted_tokens += len(acceptance.path) - 1

    def method_report(self) -> dict:
        """Each branch's counts since the last report (and its own `method_report`, if it has
        one, as "method"), and the accepted tokens of all; the counts start again from zero."""
        branches = {}
        for name, counts in self.counts.items():
            branches[name] = asdict(counts)
            branch = self.branches[name]
            if branch.capabilities.reports:
                branches[name]["method"] = branch.method_report()
        report = {"branches": branches, "accepted_tokens": self.accepted_tokens}
        self.counts = {name: BranchCounts() for name in self.branches}
        self.accepted_tokens = 0
        return report

    def _branch_drafts(self, tokens, budget, sampling, generator) -> tuple[dict[str, Draft], dict[str, _Chain]]:
        """Each asked branch's draft, in branch order, and under `chain_only` each one's chain."""
        drafts, chains = {}, {}
        for name in self._asking_order(budget):
            if chains and self._usual_length(name, budget) < max(c.promise for c in chains.values()):
                self.counts[name].rounds_skipped += 1
                continue
            draft = self.branches[name].propose(tokens, budget, sampling, generator)
            if draft is None:
                continue
            if draft.carries is not None and name != self.primary:
                raise SpeccError(
                    f"branch {name!r} drafted a tree carrying a side channel (Draft.carries: "
                    f"{type(draft.carries).__name__}), which only the primary branch ({self.primary!r}) may: "
                    f"its nodes keep their indices in a merged draft, another branch's do not")
            drafts[name] = draft
            self.counts[name].rounds_drafted += 1
            if budget.chain_only and not draft.sampled_chain:
                chain = exact_chain(draft)
                chains[name] = _Chain(chain, expected_accepted_length(self._estimates(name, chain)))
        order = [name for name in self.branches if name in drafts]
        return {name: drafts[name] for name in order}, {name: chains[name] for name in order if name in chains}

    def _asking_order(self, budget: DraftBudget) -> list[str]:
        """Branch order for asking: under `chain_only`, where one chain is verified, the cheapest
        first (a drafter's `draft_cost`, default 1; the n-gram drafter's is 0), so a costly branch
        can be spared when a cheap one already offers more than it usually delivers."""
        names = list(self.branches)
        if not budget.chain_only:
            return names
        return sorted(names, key=lambda name: self.branches[name].capabilities.draft_cost)

    def _usual_length(self, name: str, budget: DraftBudget) -> float:
        """The accepted length branch `name` has delivered per round at the budget's depth (its
        measured acceptance per depth)."""
        depth = min(budget.max_depth, budget.max_nodes - 1)
        return expected_accepted_length([self.measured[name].rate(d) for d in range(1, depth + 1)])

    def _compose(self, drafts: dict[str, Draft], chains: dict[str, _Chain],
                 budget: DraftBudget) -> tuple[Draft | None, tuple[str, ...]]:
        """The draft to verify and the branches it came from: a sampled chain alone; under
        `chain_only` the chain with the largest expected accepted length (the first on a tie);
        else the merged tree."""
        if not drafts:
            return None, ()
        sampled = next((name for name, draft in drafts.items() if draft.sampled_chain), None)
        if sampled is not None:
            return drafts[sampled], (sampled,)
        if chains:
            name = max(chains, key=lambda n: chains[n].promise)
            return chains[name].draft, (name,)
        if len(drafts) == 1:
            return next(iter(drafts.values())), tuple(drafts)
        return merge_drafts(list(drafts.values()), budget.max_nodes), tuple(drafts)

    def _estimates(self, name: str, chain: Draft) -> list[float]:
        """Per depth of `chain`, the chance it is accepted given the depth above it was."""
        nodes = first_child_path(chain.tree.parent)
        if chain.node_scores is not None:
            return chain.node_scores[nodes].tolist()
        return [self.measured[name].rate(depth) for depth in range(1, len(nodes) + 1)]

    def _attribute(self, round_: _Round, draft: Draft, path: list[int]) -> None:
        """Credit each branch with the verified and the accepted nodes whose token paths it drafted."""
        verified = token_paths(draft)
        accepted = set(path[1:])
        for name, proposed in round_.drafts.items():
            offered = set(token_paths(proposed)[1:])
            mine = [node for node in range(1, len(verified)) if verified[node] in offered]
            counts = self.counts[name]
            counts.proposed_tokens += len(mine)
            counts.accepted_tokens += sum(node in accepted for node in mine)
            if mine and name in round_.chosen:
                counts.rounds_chosen += 1


def merge_drafts(drafts: list[Draft], max_nodes: int) -> Draft:
    """The trie of `drafts` under their shared root: the first draft's nodes in its order, then
    the others' new nodes by depth (parents still come first), at most `max_nodes` in all. It
    keeps the first draft's side channel, whose nodes keep their indices (`max_nodes` is the budget
    that draft was proposed within), and carries no `node_scores`: the branches' estimates are
    not of one scale."""
    root = int(drafts[0].node_tokens[0])
    parent, tokens, depth, owner = [-1], [root], [0], [0]
    known: dict[tuple[int, int], int] = {}     # (merged parent, token) -> merged node
    for rank, draft in enumerate(drafts):
        node_tokens = draft.node_tokens.tolist()
        if node_tokens[0] != root:
            raise SpeccError(f"composed drafts disagree on the root token ({node_tokens[0]} != {root}); "
                             f"every branch must draft after the same last token")
        merged = [0]
        for node in range(1, len(node_tokens)):
            key = (merged[draft.tree.parent[node]], node_tokens[node])
            if key not in known:
                known[key] = len(parent)
                parent.append(key[0])
                tokens.append(key[1])
                depth.append(depth[key[0]] + 1)
                owner.append(rank)
            merged.append(known[key])
    kept = [0, *sorted(range(1, len(parent)), key=lambda n: (owner[n] > 0, depth[n] if owner[n] else 0, n))]
    kept = kept[:max_nodes]
    index = {node: i for i, node in enumerate(kept)}
    parents = tuple(-1 if node == 0 else index[parent[node]] for node in kept)
    return Draft(tree=tree_from_parents(parents),
                 node_tokens=torch.tensor([tokens[node] for node in kept], device=drafts[0].node_tokens.device),
                 carries=drafts[0].carries)


def first_child_path(parent: tuple[int, ...]) -> list[int]:
    """The first child of the root, its first child, and so on (parents precede children,
    so one scan in node order finds them)."""
    path, current = [], 0
    for node in range(1, len(parent)):
        if parent[node] == current:
            path.append(node)
            current = node
    return path


def chain_tokens(draft: Draft) -> list[int]:
    """The tokens of `draft`'s first-child path: the chain it ranks first."""
    return draft.node_tokens[first_child_path(draft.tree.parent)].tolist()


def token_paths(draft: Draft) -> list[tuple[int, ...]]:
    """Each node's tokens from below the root down to it (the root's: empty), which name a
    node across drafts."""
    tokens = draft.node_tokens.tolist()
    paths: list[tuple[int, ...]] = [()]
    for node in range(1, len(tokens)):
        paths.append(paths[draft.tree.parent[node]] + (tokens[node],))
    return paths


def expected_accepted_length(rates: list[float]) -> float:
    """Sum over depths d of the chance that depths 1..d are all accepted."""
    total, reach = 0.0, 1.0
    for rate in rates:
        reach *= rate
        total += reach
    return total
