"""The `eagle` method's configuration: fused layers, the draft tree, composition, training."""

from __future__ import annotations

from dataclasses import dataclass

from specc.errors import UsageError
from specc.contract.config import MethodConfig, option, require
from specc.contract.options import CalibrationOptions, CompositionOptions, DistillationOptions, OptimizerOptions


@dataclass(frozen=True)
class EagleConfig(MethodConfig, CompositionOptions, DistillationOptions, OptimizerOptions, CalibrationOptions):
    fused_layers: str = option("", "three target layers whose input states the draft head fuses (low,mid,high, "
                                   "e.g. 2,15,27; L: the last layer's output); empty picks EAGLE-3's 2, L/2, "
                                   "L-3")
    depth: int = option(6, "most draft steps per round (tree depth)", at_least=1, at_most=16)
    tree_width: int = option(4, "EAGLE-2 dynamic tree: nodes expanded per depth, and the children each one "
                                "offers; 1 drafts a chain", at_least=1, at_most=16)
    tree_nodes: int = option(24, "most drafted nodes per round: the best by cumulative draft probability",
                                 at_least=1, at_most=128)
    stop_probability: float = option(0.2, "stop growing the draft once no candidate at its deepest level has "
                                          "a cumulative draft probability of at least this (a step the head is "
                                          "unsure of costs a head call and rarely pays); 0 always grows `depth` "
                                          "levels", at_least=0, below=1, at_load=True)
    ttt_steps: int = option(3, "training-time test: draft steps the head is unrolled on its own outputs "
                               "during training", at_least=1, at_most=8)
    draft_vocab_size: int = option(8192, "rows of the draft head's LM head: the most frequent tokens of the "
                                         "training text (verification keeps the full head, so output is "
                                         "unchanged); 0 keeps the full head", at_least=0)
    # DistillationOptions, with eagle's defaults
    train_steps: int = option(2000, "head training steps at compile time, one window each, every window "
                                    "unrolled ttt_steps deep (0 keeps the initial head); on a model above "
                                    "0.45B layer parameters the default shrinks with its size")
    train_windows: int = option(768, "distinct training windows: the frozen target runs once on each and its "
                                     "fused-layer states and top-k next-token probabilities are cached; on a "
                                     "model above 0.45B layer parameters the default shrinks with its size")
    learning_rate: float = option(3e-3, "peak AdamW learning rate (betas 0.9, 0.95); the default is for a "
                                        "hidden size up to 576 and scales as 1/width above it")

    def __post_init__(self):
        super().__post_init__()   # every field's bounds, the option blocks' checks
        parse_layers(self.fused_layers)

def parse_layers(text: str) -> tuple[int, int, int] | None:
    """`"a,b,c"` as three layer indices; empty: None (chosen from the model's depth)."""
    if not text.strip():
        return None
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"fused_layers={text!r} must be three comma-separated layer indices, e.g. 2,15,27") from None
    require(len(layers) == 3 and all(t >= 1 for t in layers),
           f"fused_layers={text!r} must be three layer indices, each 1 or deeper (the state entering that layer)")
    return layers


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's choice (vLLM's and SGLang's default): the states entering layers 2, L/2 and L-3,
    moved apart in models too shallow for three distinct ones (the EAGLE-3 loaders capture a layer
    once), and inside 1..L-1 where even that is impossible (fewer than 4 layers)."""
    if num_layers < 4:
        def inside(t: int) -> int:
            return min(max(t, 1), num_layers - 1)
        return tuple(sorted((inside(2), inside(num_layers // 2), inside(num_layers - 3))))
    mid = num_layers // 2
    return min(2, mid - 1), mid, max(num_layers - 3, mid + 1)


def fused_layers(config: EagleConfig, num_layers: int) -> tuple[int, int, int]:
    return parse_layers(config.fused_layers) or default_layers(num_layers)
