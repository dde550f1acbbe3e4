"""The part of a draft whose verification rows a one-row step reproduces exactly."""

from __future__ import annotations

from specc.contract.drafter import Draft
from specc.contract.tree import TreeSpec, tree_tensors
from specc.errors import SpeccError


def exact_chain(draft: Draft) -> Draft:
    """`draft` reduced to its chain: the root and the first-child path below it (a
    caterpillar's top-1 chain; in any tree, the first-ranked candidate at each step).

    Why: a verification row attends over the cache slots its ancestors were
    written to. A chain puts each node in the slot right after its parent, as
    decoding one token at a time does; a sibling, or a node after siblings,
    sees its ancestors with masked slots between them, and the attention sums
    then group their terms differently from a one-row step. Where kernels round
    by that grouping (bfloat16, `Backend.exact_rows`) only chain rows give the
    tokens plain decoding gives."""
    tree = draft.tree
    # One node per depth is a chain in any tree: each node's parent is the one node above it,
    # which comes before it, so node i sits at depth i, in the slot after its parent.
    if all(width == 1 for width in tree.spec.widths):
        return draft
    if draft.carries is not None:
        raise SpeccError(f"the drafter proposed a tree carrying a side channel ({type(draft.carries).__name__}) "
                         f"although the budget asked for a chain (DraftBudget.chain_only); it must draft one "
                         f"node per depth")
    nodes = [0, *tree.chain_nodes]
    scores = None if draft.node_scores is None else draft.node_scores[nodes]
    return Draft(tree=tree_tensors(TreeSpec.chain(len(nodes) - 1)), node_tokens=draft.node_tokens[nodes],
                 draft_probs=draft.draft_probs, node_scores=scores)
