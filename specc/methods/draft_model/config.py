"""`draft-model`'s configuration: the draft checkpoint, the draft's shape and its head."""

from __future__ import annotations

from dataclasses import dataclass

from specc.contract.config import MethodConfig, option, require
from specc.contract.options import CalibrationOptions, CompositionOptions


@dataclass(frozen=True)
class DraftModelConfig(MethodConfig, CompositionOptions, CalibrationOptions):
    draft_model: str | None = option(None, "draft checkpoint directory (same tokenizer as the target); "
                                           "required")
    num_draft_tokens: int = option(4, "draft depth per round (gamma)", at_least=1, at_most=64, at_load=True)
    tree_width: int = option(1, "candidates per depth: 1 drafts a chain; k > 1 adds the draft's top-k "
                                "siblings at every depth (a top-1 chain with sibling fans)", at_least=1, at_most=32)
    stop_threshold: float = option(0.0, "stop drafting after a token whose top-1 draft probability is below "
                                        "this (Kangaroo's eta), so a round drafts 1..num_draft_tokens deep; "
                                        "0 always drafts num_draft_tokens", at_least=0, below=1, at_load=True)
    draft_vocab_size: int = option(0, "rows of the draft's LM head: the most frequent tokens of the "
                                      "calibration text (verification keeps the full head, so output is "
                                      "unchanged); 0, or at least the vocabulary size, keeps the full head", at_least=0)
    # CalibrationOptions, with draft-model's help
    calib_data: str | None = option(None, "text whose token frequencies choose the draft_vocab_size rows: "
                                          "a .txt file, .jsonl with string fields, or a prompt set name; "
                                          "default: the built-in corpus (Python stdlib source plus "
                                          "../shared/data text if present)")

    def __post_init__(self):
        super().__post_init__()   # every field's bounds
        require(self.draft_vocab_size == 0 or self.draft_vocab_size >= self.tree_width,
               f"draft_vocab_size={self.draft_vocab_size} is below tree_width={self.tree_width}: the head "
               f"needs a row per sibling; raise draft_vocab_size or lower tree_width")
