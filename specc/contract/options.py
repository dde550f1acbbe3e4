"""Option blocks: config fields several methods share, declared once.

A method config inherits the blocks it uses beside `MethodConfig`:

    @dataclass(frozen=True)
    class MyConfig(MethodConfig, DistillationOptions, OptimizerOptions, CalibrationOptions):
        depth: int = option(4, "tokens drafted per round")
        train_steps: int = option(1000, "adapter training steps")   # the method's own default and help
        warmup_steps: int = option(10)                               # its own default, the block's help

Each block is a frozen dataclass mixin (an `OptionBlock`) whose fields have the
defaults and help the built-in methods share; a config redeclares a field to
change its default or help (same name and type, so `--set key=value` and
manifests read the same). A block checks its fields' ranges in `__post_init__`;
a config that defines `__post_init__` calls `super().__post_init__()` after its
own checks. `specc methods` lists the config's own fields first, then each
block's in the order the bases name them.
"""

from __future__ import annotations

from dataclasses import dataclass

from specc.contract.config import OptionBlock, option
from specc.errors import UsageError


@dataclass(frozen=True)
class DistillationOptions(OptionBlock):
    """The compile-time training loop of a method that distils the frozen target into
    parameters of its own (an adapter, a draft head, projections): steps, windows, the soft
    labels, the AdamW learning-rate schedule, held-out estimates and the seed."""

    train_steps: int = option(200, "training steps at compile time, one window each (0 keeps the untrained "
                                   "parameters)")
    train_windows: int = option(64, "distinct training windows; the frozen target runs once on each")
    teacher_top_k: int = option(64, "teacher probabilities kept per position (the soft label's top-k)")
    learning_rate: float = option(3e-3, "peak AdamW learning rate (betas 0.9, 0.95)")
    warmup_steps: int = option(30, "linear learning-rate warm-up steps, then cosine decay to zero")
    train_seq_len: int = option(128, "tokens per training window")
    eval_sequences: int = option(8, "held-out windows for the acceptance estimate")
    eval_every: int = option(50, "training steps between held-out estimates")
    seed: int = option(0, "seed for data order and initialisation; training is deterministic for a seed")

    def __post_init__(self):
        _check(self.train_steps >= 0, f"train_steps={self.train_steps} must be 0 or more")
        _check(self.train_windows >= 1, f"train_windows={self.train_windows} must be at least 1")
        _check(self.teacher_top_k >= 1, f"teacher_top_k={self.teacher_top_k} must be at least 1")
        _check(self.learning_rate > 0, f"learning_rate={self.learning_rate} must be positive")
        _check(self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps} must be 0 or more")
        _check(self.train_seq_len >= 2, f"train_seq_len={self.train_seq_len} must be at least 2")
        _check(self.eval_sequences >= 1, f"eval_sequences={self.eval_sequences} must be at least 1")
        _check(self.eval_every >= 1, f"eval_every={self.eval_every} must be at least 1")
        super().__post_init__()


@dataclass(frozen=True)
class OptimizerOptions(OptionBlock):
    """AdamW's weight decay and gradient-norm clipping, for a trainer that exposes them
    (the learning rate and its schedule are in `DistillationOptions`)."""

    weight_decay: float = option(0.0, "AdamW weight decay")
    grad_clip: float = option(1.0, "clip the trained parameters' gradient norm to this")

    def __post_init__(self):
        _check(self.weight_decay >= 0, f"weight_decay={self.weight_decay} must be 0 or more")
        _check(self.grad_clip > 0, f"grad_clip={self.grad_clip} must be positive")
        super().__post_init__()


@dataclass(frozen=True)
class CompositionOptions(OptionBlock):
    """Other drafters sharing the method's draft tree (`specc.runtime.compose`): the n-gram
    continuation of the context (prompt lookup), and that of a corpus of text compiled into the
    engine. A method config inherits this block when its drafter composes (`composable`); the
    engine then builds the branches around the method's drafter (`specc.runtime.lookup_branches`)."""

    lookup: bool = option(False, "also draft the n-gram continuation of the context (prompt lookup) as "
                                 "another branch of the same tree")
    lookup_max_ngram: int = option(3, "longest suffix the lookup branch matches")
    lookup_tokens: int = option(8, "most tokens the lookup and corpus branches draft")
    lookup_corpus: str = option("", "text the target wrote (comma-separated `specc distill-data` JSONL files, "
                                    "or other JSONL/text files), tokenized into the engine at compile time: "
                                    "its n-gram continuations are another branch of the tree (up to "
                                    "lookup_tokens tokens); empty: none")

    def __post_init__(self):
        _check(1 <= self.lookup_max_ngram <= 16, f"lookup_max_ngram={self.lookup_max_ngram} must be between "
                                                 f"1 and 16")
        _check(1 <= self.lookup_tokens <= 64, f"lookup_tokens={self.lookup_tokens} must be between 1 and 64")
        super().__post_init__()


@dataclass(frozen=True)
class CalibrationOptions(OptionBlock):
    """The text a method trains or calibrates on at compile time. Whether the file exists is
    checked by the method's `validate` (`specc.contract.validation.check_data_file`), before
    any work and never when an engine loads."""

    calib_data: str | None = option(None, "training text: a JSONL file (prompt, text or turns fields; best: "
                                          "`specc distill-data` output), a text file, or a prompt set name, "
                                          "as for `specc bench --prompts`; several, comma-separated, mix "
                                          "(`builtin` names the default: Python stdlib source plus "
                                          "../shared/data text if present)")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)
