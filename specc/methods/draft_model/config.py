"""`draft-model`'s configuration: the draft checkpoint, the draft's shape and its head."""

from __future__ import annotations

from dataclasses import dataclass

from specc.errors import UsageError
from specc.contract.config import MethodConfig, option
from specc.contract.options import CalibrationOptions, CompositionOptions


@dataclass(frozen=True)
class DraftModelConfig(MethodConfig, CompositionOptions, CalibrationOptions):
    draft_model: str | None = option(None, "draft checkpoint directory (same tokenizer as the target); "
                                           "required")
    num_draft_tokens: int = option(4, "draft depth per round (gamma)")
    tree_width: int = option(1, "candidates per depth: 1 drafts a chain; k > 1 adds the draft's top-k "
                                "siblings at every depth (a top-1 chain with sibling fans)")
    stop_threshold: float = option(0.0, "stop drafting after a token whose top-1 draft probability is below "
                                        "this (Kangaroo's eta), so a round drafts 1..num_draft_tokens deep; "
                                        "0 always drafts num_draft_tokens")
    draft_vocab_size: int = option(0, "rows of the draft's LM head: the most frequent tokens of the "
                                      "calibration text (verification keeps the full head, so output is "
                                      "unchanged); 0, or at least the vocabulary size, keeps the full head")
    # CalibrationOptions, with draft-model's help
    calib_data: str | None = option(None, "text whose token frequencies choose the draft_vocab_size rows: "
                                          "a .txt file, .jsonl with string fields, or a prompt set name; "
                                          "default: the built-in corpus (Python stdlib source plus "
                                          "../shared/data text if present)")

    def __post_init__(self):
        _check(1 <= self.num_draft_tokens <= 64, f"num_draft_tokens={self.num_draft_tokens} must be between 1 and 64")
        _check(1 <= self.tree_width <= 32, f"tree_width={self.tree_width} must be between 1 and 32")
        _check(0.0 <= self.stop_threshold < 1.0,
               f"stop_threshold={self.stop_threshold} must be in [0, 1); 0 turns it off "
               f"(for one token per round use num_draft_tokens=1)")
        _check(self.draft_vocab_size >= 0,
               f"draft_vocab_size={self.draft_vocab_size} must be 0 (the full head) or positive")
        _check(self.draft_vocab_size == 0 or self.draft_vocab_size >= self.tree_width,
               f"draft_vocab_size={self.draft_vocab_size} is below tree_width={self.tree_width}: the head "
               f"needs a row per sibling; raise draft_vocab_size or lower tree_width")
        super().__post_init__()


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)
