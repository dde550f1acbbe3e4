"""SpecEE's configuration: mode, KV policy, draft head, predictors, schedule, training."""

from __future__ import annotations

from dataclasses import dataclass

from specc.errors import UsageError
from specc.contract.config import MethodConfig, option
from specc.contract.options import CalibrationOptions, DistillationOptions
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY  # noqa: F401  (re-exported: the state key)

MODES = ("lossless", "ar", "tree")
REDUCED_HEAD = "draft_head_lm"   # the draft head graph's own LM head, when its vocabulary is reduced
KV_POLICIES = ("auto", "propagate", "mask", "finish")
SCHEDULE_KEY = "schedule"


@dataclass(frozen=True)
class SpecEEConfig(MethodConfig, DistillationOptions, CalibrationOptions):
    mode: str = option("lossless", "lossless: early-exit tokens are drafts the full model verifies (output "
                                   "identical to the target); ar: the paper's public path, a token leaves at "
                                   "its exit layer unverified (lossy, faster when exits are early); tree: the "
                                   "paper's tree mode, the draft head proposes a token tree whose paths "
                                   "(hyper-tokens) are verified in one layer-stepped forward, each path leaving "
                                   "at the deepest exit any of its tokens needs (lossy, greedy only)")
    kv_policy: str = option("auto", "K/V of the layers above an exit: auto is finish in mode=ar, propagate "
                                    "otherwise; propagate computes them from the exit state (only their K/V "
                                    "projections run, as CALM does); mask: later tokens never see that token "
                                    "there (the reference code); finish (mode=ar only): the token's remaining "
                                    "layers run as extra rows beside the next token that goes deeper, so every "
                                    "K/V read is the dense model's (measured: docs/methods/specee.md)")
    candidates: int = option(4, "draft-head candidates per token (K): their LM-head rows are the reduced head")
    exit_threshold: float = option(0.0, "a predictor fires when its score exceeds this; the token exits only if "
                                         "the full head's argmax at that layer is a candidate (the guard). 0: "
                                         "calibrated at compile time, the lowest of 0.5..0.9999 whose teacher-"
                                         "forced agreement with the dense model reaches target_agreement")
    target_agreement: float = option(0.99, "the teacher-forced agreement the calibrated threshold aims for "
                                           "on the threshold_windows (held-out agreement is reported beside "
                                           "it); above the usual 0.98 goal because the engine drifts from the "
                                           "dense states these samples see (docs/methods/specee.md)")
    first_exit_layer: int = option(0, "the lowest layer with a predictor (0: a third of the way up; exits "
                                      "below it are rare and every predictor layer costs calibration time)")
    offline_layers: int = option(0, "layers in the offline schedule, ranked by exit frequency on calibration "
                                     "text (0: a quarter of the layers, the paper's 8 of 32)")
    online_tokens: int = option(5, "the online schedule adds the exit layers (-2, 0, +2) of this many "
                                   "previous tokens")
    tree_depth: int = option(3, "tree mode: draft levels below the root (the draft head runs once more "
                                "per level, and once for the leaves' candidates)")
    tree_width: int = option(2, "tree mode: nodes per level; each level's nodes are the best of the previous "
                                "level's nodes' top-`tree_width` children by cumulative draft probability "
                                "(EAGLE-2-style beam), so a tree holds 1 + depth x width nodes")
    max_draft_steps: int = option(6, "lossless mode: most early-exit tokens drafted per round")
    predictor_hidden: int = option(512, "hidden units of each exit predictor (3K -> hidden -> 1)")
    draft_vocab_size: int = option(8192, "rows of the draft head's LM head: the most frequent tokens of the "
                                         "calibration text (0 keeps the full head)")
    predictor_windows: int = option(16, "windows whose every layer is scored to train the predictors")
    threshold_windows: int = option(8, "training windows after the predictors' on which the exit threshold "
                                       "is calibrated: text the predictors never saw (0: their own windows)")
    predictor_epochs: int = option(30, "passes over the predictor samples (BCE, Adam)")
    predictor_learning_rate: float = option(1e-3, "predictor Adam learning rate (the paper's)")
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
        _check(self.mode in MODES, f"mode={self.mode!r} is not one of {', '.join(MODES)}")
        _check(self.kv_policy in KV_POLICIES, f"kv_policy={self.kv_policy!r} is not one of {', '.join(KV_POLICIES)}")
        _check(self.kv_policy != "finish" or self.mode == "ar",
               f"kv_policy=finish needs mode=ar (mode={self.mode!r} verifies or flattens exited tokens itself)")
        _check(1 <= self.candidates <= 64, f"candidates={self.candidates} must be between 1 and 64")
        _check(0.0 <= self.exit_threshold < 1.0, f"exit_threshold={self.exit_threshold} must be in [0, 1) "
                                                  f"(0 calibrates it)")
        _check(0.0 < self.target_agreement <= 1.0, f"target_agreement={self.target_agreement} must be in (0, 1]")
        _check(self.first_exit_layer >= 0, f"first_exit_layer={self.first_exit_layer} must be 0 (automatic) or more")
        _check(self.offline_layers >= 0, f"offline_layers={self.offline_layers} must be 0 (automatic) or more")
        _check(self.online_tokens >= 0, f"online_tokens={self.online_tokens} must be 0 or more")
        _check(1 <= self.tree_depth <= 16, f"tree_depth={self.tree_depth} must be between 1 and 16")
        _check(1 <= self.tree_width <= 16, f"tree_width={self.tree_width} must be between 1 and 16")
        _check(1 <= self.max_draft_steps <= 64, f"max_draft_steps={self.max_draft_steps} must be between 1 and 64")
        _check(self.predictor_hidden >= 1, f"predictor_hidden={self.predictor_hidden} must be positive")
        _check(self.draft_vocab_size >= 0, f"draft_vocab_size={self.draft_vocab_size} must be 0 or more")
        _check(self.threshold_windows >= 0, f"threshold_windows={self.threshold_windows} must be 0 or more")
        _check(self.predictor_windows >= 1, f"predictor_windows={self.predictor_windows} must be at least 1")
        _check(self.predictor_epochs >= 0, f"predictor_epochs={self.predictor_epochs} must be 0 or more")
        _check(self.predictor_learning_rate > 0,
               f"predictor_learning_rate={self.predictor_learning_rate} must be positive")
        super().__post_init__()   # the option blocks' checks


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)
