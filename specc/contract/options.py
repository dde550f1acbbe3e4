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
manifests read the same). A field declares the values it allows in `option`
(`at_least`, `at_most`, `above`, `below`, `choices`: `specc.contract.bounds`), and
`MethodConfig` checks them all in one place; a redeclared field keeps its block's
bounds. A config that relates fields to each other checks that in `__post_init__`,
after `super().__post_init__()`. `specc methods` lists the config's own fields first,
then each block's in the order the bases name them, each with what it allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from specc.contract.config import OptionBlock, option


@dataclass(frozen=True)
class DistillationOptions(OptionBlock):
    """The compile-time training loop of a method that distils the frozen target into
    parameters of its own (an adapter, a draft head, projections): steps, windows, the soft
    labels, the AdamW learning-rate schedule, held-out estimates and the seed."""

    train_steps: int = option(200, "training steps at compile time, one window each (0 keeps the untrained "
                                   "parameters)", at_least=0)
    train_windows: int = option(64, "distinct training windows; the frozen target runs once on each", at_least=1)
    teacher_top_k: int = option(64, "teacher probabilities kept per position (the soft label's top-k)", at_least=1)
    learning_rate: float = option(3e-3, "peak AdamW learning rate (betas 0.9, 0.95)", above=0)
    warmup_steps: int = option(30, "linear learning-rate warm-up steps, then cosine decay to zero", at_least=0)
    train_seq_len: int = option(128, "tokens per training window", at_least=2)
    eval_sequences: int = option(8, "held-out windows for the acceptance estimate", at_least=1)
    eval_every: int = option(50, "training steps between held-out estimates", at_least=1)
    seed: int = option(0, "seed for data order and initialisation; training is deterministic for a seed")


@dataclass(frozen=True)
class OptimizerOptions(OptionBlock):
    """AdamW's weight decay and gradient-norm clipping, for a trainer that exposes them
    (the learning rate and its schedule are in `DistillationOptions`)."""

    weight_decay: float = option(0.0, "AdamW weight decay", at_least=0)
    grad_clip: float = option(1.0, "clip the trained parameters' gradient norm to this", above=0)


@dataclass(frozen=True)
class CompositionOptions(OptionBlock):
    """Other drafters sharing the method's draft tree (`specc.runtime.compose`): the n-gram
    continuation of the context (prompt lookup), and that of a corpus of text compiled into the
    engine. A method config inherits this block when its drafter composes (`composable`); the
    engine then builds the branches around the method's drafter (`specc.engine.composition`)."""

    lookup: bool = option(False, "also draft the n-gram continuation of the context (prompt lookup) as "
                                 "another branch of the same tree", at_load=True)
    lookup_max_ngram: int = option(3, "longest suffix the lookup branch matches", at_least=1, at_most=16, at_load=True)
    lookup_tokens: int = option(8, "most tokens the lookup and corpus branches draft", at_least=1, at_most=64,
                                at_load=True)
    lookup_corpus: str = option("", "text the target wrote (comma-separated `specc distill-data` JSONL files, "
                                    "or other JSONL/text files), tokenized into the engine at compile time: "
                                    "its n-gram continuations are another branch of the tree (up to "
                                    "lookup_tokens tokens); empty: none")


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

