"""Token trees for verification, turned into static tensors once per shape.

A tree is its parents: node 0 is the root (the last committed token, whose
KV is not cached yet), and every other node comes after its parent, so one
scan in node order meets a node's children after it (what the acceptance
walks and kernels rely on). Siblings are ranked in node order: the first
child is the candidate a drafter trusts most.

`tree_tensors(TreeSpec(widths))` builds specc's usual "caterpillars": a
top-1 chain with a fan of sibling candidates at each depth. `widths[d]` is
how many candidates depth d+1 holds; the first of them is the chain node
that continues, the others are leaves. A chain (all widths 1) is plain
speculative decoding. `tree_from_parents(parents)` builds a tree of any
shape (a merged trie of several drafters, a dynamic tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class TreeSpec:
    """Nodes per depth below the root: a caterpillar's widths (`tree_tensors`), or
    the level sizes of a tree of any shape (`tree_from_parents`)."""

    widths: tuple[int, ...]

    def __post_init__(self):
        if any(w < 1 for w in self.widths):
            raise ValueError(f"tree widths must be >= 1, got {self.widths}")

    @classmethod
    def chain(cls, length: int) -> "TreeSpec":
        return cls((1,) * length)

    @property
    def depth(self) -> int:
        return len(self.widths)

    @property
    def num_nodes(self) -> int:
        return 1 + sum(self.widths)


@dataclass(frozen=True)
class TreeTensors:
    """Everything the verifier needs about one tree shape, built once."""

    spec: TreeSpec
    depth: torch.Tensor            # [n] depth of each node, root 0
    parent: tuple[int, ...]        # parent node index, root -1
    ancestor_mask: torch.Tensor    # [n, n] True where row may attend column
    level_nodes: tuple[tuple[int, ...], ...]  # node indices at depth 1..D
    chain_nodes: tuple[int, ...]   # the first-child path below the root (a caterpillar's top-1 chain)
    child_nodes: tuple[tuple[int, ...], ...]  # each node's children, in node order
    paths: tuple[tuple[int, ...], ...]  # root-to-leaf node indices, one per leaf, leaves in node order

    def children(self, node: int) -> tuple[int, ...]:
        """Children of `node`, in node order (the order the acceptance walks try them)."""
        return self.child_nodes[node]

    def depth_of(self, node: int) -> int:
        return int(self.depth[node])


@lru_cache(maxsize=64)
def tree_tensors(spec: TreeSpec) -> TreeTensors:
    """The caterpillar of `spec`: depth d+1's nodes all hang under depth d's first node."""
    parent = [-1]
    chain_parent = 0
    for width in spec.widths:
        start = len(parent)
        parent += [chain_parent] * width
        chain_parent = start
    return tree_from_parents(tuple(parent))


@lru_cache(maxsize=256)
def tree_from_parents(parents: tuple[int, ...]) -> TreeTensors:
    """The tree whose node i hangs under `parents[i]`: `parents[0]` is -1 (the root) and
    every other parent comes before its child. Drafts of varying shape (merged tries)
    come back often enough that caching the tensors per shape pays."""
    check_parents(parents)
    n = len(parents)
    depth = [0] * n
    children: list[list[int]] = [[] for _ in range(n)]
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[0, 0] = True
    for node in range(1, n):
        parent = parents[node]
        depth[node] = depth[parent] + 1
        children[parent].append(node)
        mask[node] = mask[parent]     # parents come first, so the parent's row is complete
        mask[node, node] = True
    levels = tuple(tuple(node for node in range(n) if depth[node] == level) for level in range(1, max(depth) + 1))
    return TreeTensors(
        spec=TreeSpec(tuple(map(len, levels))), depth=torch.tensor(depth), parent=tuple(parents),
        ancestor_mask=mask, level_nodes=levels, chain_nodes=_first_child_path(children),
        child_nodes=tuple(map(tuple, children)), paths=_leaf_paths(parents, children),
    )


def check_parents(parents: tuple[int, ...]) -> None:
    """Node 0 is the root (parent -1); every other node's parent is an earlier node."""
    if not parents or parents[0] != -1:
        raise ValueError(f"a tree's parents start with the root's -1; got {parents} "
                         f"(give node 0 parent -1 and number the drafted nodes from 1)")
    for node, parent in enumerate(parents[1:], start=1):
        if not isinstance(parent, int) or not 0 <= parent < node:
            raise ValueError(f"node {node} has parent {parent!r}; every parent must be an earlier node "
                             f"(0 <= parent < {node}): number the nodes so that parents precede children, "
                             f"e.g. breadth-first")


def _leaf_paths(parents: tuple[int, ...], children: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    paths = []
    for leaf in (node for node in range(len(parents)) if not children[node]):
        path, node = [], leaf
        while node >= 0:
            path.append(node)
            node = parents[node]
        paths.append(tuple(reversed(path)))
    return tuple(paths)


def _first_child_path(children: list[list[int]]) -> tuple[int, ...]:
    path, node = [], 0
    while children[node]:
        node = children[node][0]
        path.append(node)
    return tuple(path)
