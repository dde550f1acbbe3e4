"""Token trees for verification, turned into static tensors once per shape.

specc's trees are "caterpillars": a top-1 chain with a fan of sibling
candidates at each depth. `TreeSpec.widths[d]` is how many candidates
depth d+1 holds; the first of them is the chain node that continues, the
others are leaves. A chain (all widths 1) is plain speculative decoding.
Node 0 is the root: the last committed token, whose KV is not cached yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class TreeSpec:
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
    chain_nodes: tuple[int, ...]   # the continuing node at depth 1..D

    def children(self, node: int) -> tuple[int, ...]:
        """Children of `node`: only chain nodes (and the root) have any."""
        level = self.depth_of(node)
        if level >= self.spec.depth or (node != 0 and node != self.chain_nodes[level - 1]):
            return ()
        return self.level_nodes[level]

    def depth_of(self, node: int) -> int:
        return int(self.depth[node])


@lru_cache(maxsize=64)
def tree_tensors(spec: TreeSpec) -> TreeTensors:
    parent = [-1]
    depth = [0]
    levels: list[tuple[int, ...]] = []
    chain_parent = 0
    for level, width in enumerate(spec.widths, start=1):
        start = len(parent)
        nodes = tuple(range(start, start + width))
        parent += [chain_parent] * width
        depth += [level] * width
        levels.append(nodes)
        chain_parent = nodes[0]
    n = len(parent)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for node in range(n):
        walk = node
        while walk >= 0:
            mask[node, walk] = True
            walk = parent[walk]
    return TreeTensors(
        spec=spec, depth=torch.tensor(depth), parent=tuple(parent), ancestor_mask=mask,
        level_nodes=tuple(levels), chain_nodes=tuple(level[0] for level in levels),
    )
