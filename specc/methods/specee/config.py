"""SpecEE's configuration: mode, KV policy, draft head, predictors, schedule, training."""

from __future__ import annotations

from dataclasses import dataclass

from specc.contract.config import MethodConfig, option, require
from specc.contract.options import CalibrationOptions, CompositionOptions, DistillationOptions
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY  # noqa: F401  (re-exported: the state key)

MODES = ("lossless", "ar", "tree")
REDUCED_HEAD = "draft_head_lm"   # the draft head graph's own LM head, when its vocabulary is reduced
KV_POLICIES = ("auto", "propagate", "mask", "finish")
SCHEDULE_KEY = "schedule"


@dataclass(frozen=True)
class SpecEEConfig(MethodConfig, CompositionOptions, DistillationOptions, CalibrationOptions):
    mode: str = option("lossless", "lossless: early-exit tokens are drafts the full model verifies (output "
                                   "identical to the target); ar: the paper's public path, a token leaves at "
                                   "its exit layer unverified (lossy, faster when exits are early); tree: the "
                                   "paper's tree mode, the draft head proposes a token tree whose paths "
                                   "(hyper-tokens) are verified in one layer-stepped forward, each path leaving "
                                   "at the deepest exit any of its tokens needs (lossy, greedy only)", choices=MODES)
    kv_policy: str = option("auto", "K/V of the layers above an exit: auto is finish in mode=ar, propagate "
                                    "otherwise; propagate computes them from the exit state (only their K/V "
                                    "projections run, as CALM does); mask: later tokens never see that token "
                                    "there (the reference code); finish (mode=ar only): the token's remaining "
                                    "layers run as extra rows beside the next token that goes deeper, so every "
                                    "K/V read is the dense model's (measured: docs/methods/specee.md)",
                                    choices=KV_POLICIES)
    candidates: int = option(4, "draft-head candidates per token (K): their LM-head rows are the reduced head",
                                at_least=1, at_most=64)
    exit_threshold: float = option(0.0, "a predictor fires when its score exceeds this; the token exits only if "
                                         "the full head's argmax at that layer is a candidate (the guard). 0: "
                                         "calibrated at compile time, the lowest of 0.5..0.9999 whose teacher-"
                                         "forced agreement with the dense model reaches target_agreement",
                                         at_least=0, below=1)
    target_agreement: float = option(0.99, "the teacher-forced agreement the calibrated threshold aims for "
                                           "on the threshold_windows (held-out agreement is reported beside "
                                           "it); above the usual 0.98 goal because the engine drifts from the "
                                           "dense states these samples see (docs/methods/specee.md)",
                                           above=0, at_most=1)
    first_exit_layer: int = option(0, "the lowest layer with a predictor (0: a third of the way up; exits "
                                      "below it are rare and every predictor layer costs calibration time)", at_least=0)
    offline_layers: int = option(0, "layers in the offline schedule, ranked by exit frequency on calibration "
                                     "text (0: a quarter of the layers, the paper's 8 of 32)", at_least=0)
    online_tokens: int = option(5, "the online schedule adds the exit layers (-2, 0, +2) of this many "
                                   "previous tokens", at_least=0)
    tree_depth: int = option(3, "tree mode: draft levels below the root (the draft head runs once more "
                                "per level, and once for the leaves' candidates)", at_least=1, at_most=16)
    tree_width: int = option(2, "tree mode: nodes per level; each level's nodes are the best of the previous "
                                "level's nodes' top-`tree_width` children by cumulative draft probability "
                                "(EAGLE-2-style beam), so a tree holds 1 + depth x width nodes", at_least=1, at_most=16)
    max_draft_steps: int = option(6, "lossless mode: most early-exit tokens drafted per round", at_least=1, at_most=64)
    predictor_hidden: int = option(512, "hidden units of each exit predictor (3K -> hidden -> 1)", at_least=1)
    draft_vocab_size: int = option(8192, "rows of the draft head's LM head: the most frequent tokens of the "
                                         "calibration text (0 keeps the full head)", at_least=0)
    predictor_windows: int = option(16, "windows whose every layer is scored to train the predictors", at_least=1)
    threshold_windows: int = option(8, "training windows after the predictors' on which the exit threshold "
                                       "is calibrated: text the predictors never saw (0: their own windows)",
                                       at_least=0)
    predictor_epochs: int = option(30, "passes over the predictor samples (BCE, Adam)", at_least=0)
    predictor_learning_rate: float = option(1e-3, "predictor Adam learning rate (the paper's)", above=0)
    # DistillationOptions (the draft head's training), with SpecEE's defaults and help
    train_steps: int = option(600, "draft-head training steps (one sequence each, self-distilled)")
    train_windows: int = option(128)
    learning_rate: float = option(3e-3, "draft-head peak AdamW learning rate")
    warmup_steps: int = option(30, "draft-head linear warm-up steps, then cosine decay")
    eval_sequences: int = option(8, "held-out sequences for draft-head agreement and exit quality")
    eval_every: int = option(100, "draft-head steps between held-out estimates")

    @property
    def resolved_kv_policy(self) -> str:
        if self.kv_policy != "auto":
            return self.kv_policy
        return "finish" if self.mode == "ar" else "propagate"

    def __post_init__(self):
        super().__post_init__()   # every field's bounds, the option blocks' checks
        require(self.kv_policy != "finish" or self.mode == "ar",
               f"kv_policy=finish needs mode=ar (mode={self.mode!r} verifies or flattens exited tokens itself)")
        require(self.mode == "lossless" or not (self.lookup or self.lookup_corpus),
               f"lookup and lookup_corpus share mode=lossless's draft chain with lookup branches; mode={self.mode!r} "
               f"drafts no chain another branch can join")
