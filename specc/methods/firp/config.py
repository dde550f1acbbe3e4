"""FIRP's configuration: projection layers, the draft tree, which nodes get pseudo rows, training."""

from __future__ import annotations

from dataclasses import dataclass

from specc.errors import UsageError
from specc.contract.config import MethodConfig, option, require
from specc.contract.options import CalibrationOptions, DistillationOptions, OptimizerOptions
from specc.methods.firp.insert_pseudo_hidden_projections import PseudoHiddenConfig

TREE_NAMES = ("chain", "cpu", "16", "32", "63")
PSEUDO_ROWS = ("chain", "all")
CPU_TREE = (2, 2, 1)        # widths at depth 1, 2, 3, …: 5 drafted tokens
FAN_DECAY = 0.7             # a sized tree's width at depth d+1 is about 0.7 × the width at depth d


@dataclass(frozen=True)
class FIRPConfig(MethodConfig, DistillationOptions, OptimizerOptions, CalibrationOptions):
    steps: int = option(3, "k: tokens drafted from pseudo hidden states per node (the paper's k = 3); "
                           "ignored when layers is given", at_least=1, at_most=16)
    layers: tuple[int, ...] = option((), "t_1,...,t_k: decoder layers below each step's projection, "
                                         "non-decreasing in 1..L-1; default: the paper's 15,20,25 of 32 layers "
                                         "scaled to the model's depth (30 layers: 14,19,23)")
    tree: str = option("cpu", "draft tree: chain (the top-1 of each step), cpu (widths 2,2,1: the top-2 at "
                              "depths 1 and 2), 16/32/63 (the paper's node budgets: the per-step top-k merged "
                              "into a top-1 chain with sibling fans, e.g. 7,5,3 for 16 nodes), or explicit "
                              "widths per depth, e.g. 4,2,1. Sampling with a chain draws each step's token "
                              "from its distribution; any other tree is verified by per-sibling rejection")
    pseudo_rows: str = option("chain", "which tree nodes get pseudo rows in the verification forward: chain "
                                       "(the root and the top-1 chain: k rows each; when a sibling ends the "
                                       "accepted path the next draft uses its parent's pseudo rows, one step "
                                       "shorter) or all (every node: k rows per node, no shorter drafts, "
                                       "but every extra row costs a full forward row on the CPU)", choices=PSEUDO_ROWS)
    # DistillationOptions and OptimizerOptions, with FIRP's defaults and help
    train_steps: int = option(100, "training steps per projection at compile time (k projections, trained "
                                   "one after another), one window each; 0 keeps the untrained projections "
                                   "(identity, zero bias). A step backpropagates one window through the "
                                   "layers above t_i and the LM head (training times: docs/methods/firp.md)")
    train_windows: int = option(32, "distinct training windows: the frozen target runs once on each; its K/V, "
                                    "hidden states at every t_i and top-k next-token probabilities are kept "
                                    "in memory, and each trained step's pseudo K/V is added")
    warmup_steps: int = option(10)
    grad_clip: float = option(1.0, "clip each projection's gradient norm to this")
    eval_sequences: int = option(4, "held-out windows for the per-step agreement estimate")
    seed: int = option(0, "seed for data order; training is deterministic for a seed")

    def __post_init__(self):
        super().__post_init__()   # every field's bounds, the option blocks' checks
        require(list(self.layers) == sorted(self.layers) and all(t >= 1 for t in self.layers),
               f"layers={','.join(map(str, self.layers))} must be non-decreasing layers >= 1 (t_1 <= t_2 ...)")
        require(len(self.layers) <= 16, f"layers has {len(self.layers)} entries; at most 16 steps")
        tree_widths(self.tree, self.num_steps)   # raises on a bad tree
        require(self.train_seq_len >= self.num_steps + 2,
               f"train_seq_len={self.train_seq_len} must be at least steps + 2 = {self.num_steps + 2}")

    @property
    def num_steps(self) -> int:
        return len(self.layers) or self.steps

    def pass_config(self) -> PseudoHiddenConfig:
        return PseudoHiddenConfig(layers=tuple(self.layers), steps=self.steps)

    def widths(self) -> tuple[int, ...]:
        return tree_widths(self.tree, self.num_steps)


def tree_widths(tree: str, depth: int) -> tuple[int, ...]:
    """Candidates at depth 1..`depth` of the static draft tree named `tree`."""
    if tree == "chain":
        return (1,) * depth
    if tree == "cpu":
        return (CPU_TREE + (1,) * depth)[:depth]
    if tree in TREE_NAMES:
        return sized_tree(int(tree), depth)
    try:
        widths = tuple(int(w) for w in tree.split(","))
    except ValueError:
        widths = ()
    if len(widths) != depth or any(w < 1 for w in widths):
        raise UsageError(f"tree={tree!r} must be one of {', '.join(TREE_NAMES)} or {depth} comma-separated widths "
                         f">= 1 (one per step, e.g. {','.join(map(str, sized_tree(16, depth)))})")
    return widths


def sized_tree(nodes: int, depth: int) -> tuple[int, ...]:
    """Widths summing to `nodes` - 1 (the root is the bonus token), decaying with depth."""
    weights = [FAN_DECAY ** d for d in range(depth)]
    total = nodes - 1
    widths = [max(1, round(total * w / sum(weights))) for w in weights]
    widths[0] = max(1, widths[0] + total - sum(widths))
    return tuple(widths)
