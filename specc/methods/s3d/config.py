"""S3D's configuration: the skipped block, mask-token drafting, the draft-only adapters and their training."""

from __future__ import annotations

from dataclasses import dataclass

from specc.contract.config import MethodConfig, option, require
from specc.contract.options import CalibrationOptions, DistillationOptions, OptimizerOptions
from specc.methods.s3d.attach_draft_lora import DraftLoraConfig
from specc.methods.s3d.skip_middle_layers import DEFAULT_SKIP_RATIO, SkipMiddleLayersConfig


@dataclass(frozen=True)
class S3DConfig(MethodConfig, DistillationOptions, OptimizerOptions, CalibrationOptions):
    draft_tokens: int = option(4, "gamma: tokens drafted per round by one draft forward over the last token "
                                  "and gamma-1 mask tokens", at_least=1, at_most=32)
    skip_ratio: float = option(DEFAULT_SKIP_RATIO, "share of the layers the draft skips, as one centred block of "
                                                   "round(ratio * L) middle layers (first and last layer always "
                                                   "kept). The paper's optimum is about 0.5 on 7B models; small "
                                                   "models have less redundancy, hence a third by default",
                                                   at_least=0, below=1)
    skip_layers: tuple[int, ...] = option((), "the skipped block as first,last (inclusive, e.g. 10,19); "
                                              "overrides skip_ratio")
    select: bool = option(True, "choose the skipped block and gamma at compile time by S3D eq. 12 from measured "
                                "costs and pilot-trained acceptance (see select.py); false keeps skip_ratio or "
                                "skip_layers and draft_tokens as given. An explicit skip_layers is the only block "
                                "considered; gamma is still chosen")
    select_ratios: tuple[float, ...] = option((0.2, 0.33, 0.5), "skip ratios the eq. 12 choice compares "
                                                                 "(each a centred block of round(ratio * L) layers)")
    select_max_tokens: int = option(6, "largest gamma the eq. 12 choice considers (pilots train this many "
                                       "draft positions)", at_least=1, at_most=32)
    select_steps: int = option(30, "pilot training steps per candidate block before its acceptance is measured; "
                                   "the chosen candidate keeps training from there for train_steps more", at_least=1)
    lora_rank: int = option(8, "rank of the draft-only LoRA adapters on the kept layers' projections", at_least=1)
    lora_alpha: float = option(16.0, "LoRA scale numerator: the adapter output is multiplied by alpha/rank", above=0)
    lora_mlp: bool = option(False, "adapt the MLP projections too (the attention projections always are)")
    tree_width: int = option(1, "candidates at a low-confidence depth: 1 drafts a chain; k > 1 adds the draft's "
                                "top-k there (a top-1 chain with sibling fans)", at_least=1, at_most=32)
    tree_threshold: float = option(0.8, "a depth is low-confidence when its top-1 draft probability is below this "
                                        "(used only with tree_width > 1)", at_least=0, at_most=1)
    # DistillationOptions, with S3D's defaults and help
    train_steps: int = option(200, "training steps at compile time, one window each (0 keeps the untrained "
                                   "adapters: B = 0, the mask embedding is the mean token embedding); a step "
                                   "backpropagates through the kept layers (training times: docs/methods/s3d.md)")
    train_windows: int = option(64, "distinct training windows: the frozen target runs once on each and its KV "
                                     "(kept layers) and top-k next-token probabilities are kept in memory")
    learning_rate: float = option(2e-3)
    eval_sequences: int = option(8, "held-out windows for the per-position acceptance estimate")
    seed: int = option(0, "seed for adapter initialisation, data order and mask placement; training is "
                          "deterministic for a seed")

    def __post_init__(self):
        super().__post_init__()   # every field's bounds, the option blocks' checks
        block = self.skip_layers
        require(block == () or (len(block) == 2 and 1 <= block[0] <= block[1]),
               f"skip_layers={','.join(map(str, self.skip_layers))} must be two layers first,last with "
               f"1 <= first <= last (layer 0 is always kept)")
        require(bool(self.select_ratios) and all(0.0 < r < 1.0 for r in self.select_ratios),
               f"select_ratios={','.join(map(str, self.select_ratios))} must be skip ratios in (0, 1)")

    def skip_config(self) -> SkipMiddleLayersConfig:
        first, last = self.skip_layers or (None, None)
        return SkipMiddleLayersConfig(first, last, self.skip_ratio)

    def lora_config(self) -> DraftLoraConfig:
        return DraftLoraConfig(rank=self.lora_rank, alpha=self.lora_alpha, mlp=self.lora_mlp, seed=self.seed)
