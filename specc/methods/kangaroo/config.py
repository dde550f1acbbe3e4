"""Kangaroo's configuration: exit layer, drafting and adapter training."""

from __future__ import annotations

from dataclasses import dataclass

from specc.errors import UsageError
from specc.contract.config import MethodConfig, option
from specc.contract.options import CalibrationOptions, CompositionOptions, DistillationOptions, OptimizerOptions
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY  # noqa: F401  (re-exported: the state key)


@dataclass(frozen=True)
class KangarooConfig(MethodConfig, CompositionOptions, DistillationOptions, OptimizerOptions, CalibrationOptions):
    exit_layer: int = option(0, "shallow layers the draft shares with the target (l); 0 picks "
                                "max(1, round(L/16)), the paper's 2 of 32")
    adapter_mlp: bool = option(True, "keep layer l's MLP in the adapter (a whole decoder layer, as EAGLE's "
                                     "draft block); false is the paper's attention-only adapter (the MLP "
                                     "raises held-out agreement at equal training: docs/methods/kangaroo.md)")
    max_draft_steps: int = option(6, "most tokens drafted per round (gamma)")
    exit_threshold: float = option(0.6, "stop drafting after a token whose top-1 draft probability is "
                                        "below this (eta); 0 drafts max_draft_steps every round")
    skip_threshold: float = option(0.0, "draft nothing in a round whose first token's top-1 draft probability "
                                        "is below this (the round is a plain step), for hardware where verifying "
                                        "a likely-wrong token costs more than it is expected to win; 0 always "
                                        "drafts, as the paper (measured: docs/methods/kangaroo.md)")
    tree_width: int = option(1, "candidates at a low-confidence depth: 1 drafts a chain; k > 1 adds the "
                                "adapter's top-k there (a top-1 chain with sibling fans)")
    tree_threshold: float = option(0.8, "a depth is low-confidence when its top-1 draft probability is "
                                        "below this (used only with tree_width > 1)")
    draft_vocab_size: int = option(8192, "rows of the adapter's LM head: the most frequent tokens of the "
                                         "calibration text (verification keeps the full head, so output is "
                                         "unchanged); 0, or at least the vocabulary size, keeps the full head")
    # DistillationOptions, with Kangaroo's defaults
    train_steps: int = option(3000, "adapter training steps at compile time, one sequence each "
                                    "(0 keeps the initial adapter: copies of layer l's attention and MLP); "
                                    "agreement and training time by setting: docs/methods/kangaroo.md")
    train_windows: int = option(768, "distinct training windows (at most train_steps are used): the frozen "
                                     "target runs once on each and its exit states and top-k next-token "
                                     "probabilities are cached; the steps cycle through them")
    learning_rate: float = option(3e-3, "peak AdamW learning rate (betas 0.9, 0.95); the paper's 5e-5 is "
                                        "for far longer runs (rates compared: benchmarks/NOTES.md)")

    def __post_init__(self):
        _check(self.exit_layer >= 0, f"exit_layer={self.exit_layer} must be 0 (automatic) or positive")
        _check(1 <= self.max_draft_steps <= 64, f"max_draft_steps={self.max_draft_steps} must be between 1 and 64")
        _check(0.0 <= self.exit_threshold <= 1.0, f"exit_threshold={self.exit_threshold} must be in [0, 1]")
        _check(0.0 <= self.skip_threshold <= 1.0, f"skip_threshold={self.skip_threshold} must be in [0, 1]")
        _check(1 <= self.tree_width <= 32, f"tree_width={self.tree_width} must be between 1 and 32")
        _check(0.0 <= self.tree_threshold <= 1.0, f"tree_threshold={self.tree_threshold} must be in [0, 1]")
        _check(self.draft_vocab_size >= 0, f"draft_vocab_size={self.draft_vocab_size} must be 0 or more")
        super().__post_init__()   # the option blocks' checks


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)
