"""The part of a draft whose verification rows a one-row step reproduces exactly."""

from __future__ import annotations

from specc.errors import SpeccError
from specc.runtime.drafter import Draft
from specc.runtime.tree import TreeSpec, TreeTensors, tree_tensors


def exact_chain(draft: Draft) -> Draft:
    """`draft` reduced to its chain: the root and the first node of each depth.

    Why: a verification row attends over the cache slots its ancestors were
    written to. A chain puts each node in the slot right after its parent, as
    decoding one token at a time does; a sibling, or a node after siblings,
    sees its ancestors with masked slots between them, and the attention sums
    then group their terms differently from a one-row step. Where kernels round
    by that grouping (bfloat16, `Backend.exact_rows`) only chain rows give the
    tokens plain decoding gives."""
    tree = draft.tree
    if not isinstance(tree, TreeTensors) or all(width == 1 for width in tree.spec.widths):
        return draft    # a chain already, or a method's own tree type verified by its own target
    if draft.extras:
        raise SpeccError("the drafter proposed a tree carrying method tensors (Draft.extras) although the "
                         "budget asked for a chain (DraftBudget.chain_only); it must draft one node per depth")
    nodes = [0, *tree.chain_nodes]
    return Draft(tree=tree_tensors(TreeSpec.chain(len(nodes) - 1)), node_tokens=draft.node_tokens[nodes],
                 draft_probs=draft.draft_probs)
