"""Kangaroo's configuration: exit layer, drafting and adapter training."""

from __future__ import annotations

from dataclasses import dataclass

from specc.contract.config import MethodConfig, option
from specc.contract.options import CalibrationOptions, CompositionOptions, DistillationOptions, OptimizerOptions
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY  # noqa: F401  (re-exported: the state key)


@dataclass(frozen=True)
class KangarooConfig(MethodConfig, CompositionOptions, DistillationOptions, OptimizerOptions, CalibrationOptions):
    exit_layer: int = option(0, "shallow layers the draft shares with the target (l); 0 picks "
                                "max(1, round(L/16)), the paper's 2 of 32", at_least=0)
    adapter_mlp: bool = option(True, "keep layer l's MLP in the adapter (a whole decoder layer, as EAGLE's "
                                     "draft block); false is the paper's attention-only adapter (the MLP "
                                     "raises held-out agreement at equal training: docs/methods/kangaroo.md)")
    max_draft_steps: int = option(6, "most tokens drafted per round (gamma)", at_least=1, at_most=64)
    exit_threshold: float = option(0.6, "stop drafting after a token whose top-1 draft probability is "
                                        "below this (eta); 0 drafts max_draft_steps every round", at_least=0, at_most=1)
    skip_threshold: float = option(0.0, "draft nothing in a round whose first token's top-1 draft probability "
                                        "is below this (the round is a plain step), for hardware where verifying "
                                        "a likely-wrong token costs more than it is expected to win; 0 always "
                                        "drafts, as the paper (measured: docs/methods/kangaroo.md)",
                                        at_least=0, at_most=1)
    tree_width: int = option(1, "candidates at a low-confidence depth: 1 drafts a chain; k > 1 adds the "
                                "adapter's top-k there (a top-1 chain with sibling fans)", at_least=1, at_most=32)
    tree_threshold: float = option(0.8, "a depth is low-confidence when its top-1 draft probability is "
                                        "below this (used only with tree_width > 1)", at_least=0, at_most=1)
    draft_vocab_size: int = option(8192, "rows of the adapter's LM head: the most frequent tokens of the "
                                         "calibration text (verification keeps the full head, so output is "
                                         "unchanged); 0, or at least the vocabulary size, keeps the full head",
                                         at_least=0)
    # DistillationOptions, with Kangaroo's defaults
    train_steps: int = option(3000, "adapter training steps at compile time, one sequence each "
                                    "(0 keeps the initial adapter: copies of layer l's attention and MLP); "
                                    "agreement and training time by setting: docs/methods/kangaroo.md; on a "
                                    "model above 0.45B layer parameters the default shrinks with its size")
    train_windows: int = option(768, "distinct training windows (at most train_steps are used): the frozen "
                                     "target runs once on each and its exit states and top-k next-token "
                                     "probabilities are cached; the steps cycle through them; on a model above "
                                     "0.45B layer parameters the default shrinks with its size")
    learning_rate: float = option(3e-3, "peak AdamW learning rate (betas 0.9, 0.95); the paper's 5e-5 is "
                                        "for far longer runs (rates compared: benchmarks/NOTES.md); the "
                                        "default is for a hidden size up to 576 and scales as 1/width above it")
