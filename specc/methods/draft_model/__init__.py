"""Method `draft-model`: classic speculative decoding with a small HF draft model.

The draft model is captured and rewritten with the same infrastructure
passes as the target and keeps its own KV cache. It drafts a chain (or a
caterpillar tree with its top-k at each depth), optionally stopping below a
confidence `stop_threshold`; the target verifies the flattened tree in one
forward. With `draft_vocab_size`, the compile step cuts the draft's LM head
(a large share of a small model's weights) to the most frequent tokens of
calibration text (`reduce_draft_vocabulary` on the `draft` graph).
"""

from __future__ import annotations

from specc.contract.descriptor import TARGET, ExtraSource, GraphRecipe, MethodDescriptor, TrainResult
from specc.methods.draft_model.config import DraftModelConfig
from specc.methods.draft_model.drafter import DraftModelDrafter, build_runtime
from specc.contract.infrastructure import infrastructure_passes
from specc.passes.reduce_draft_vocabulary import reduced_head_passes
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY

__all__ = ["METHOD", "DraftModelConfig", "DraftModelDrafter"]


def _train(context, config: DraftModelConfig, tokenizer) -> TrainResult:
    from specc.train.reduce_draft_head import reduce_draft_head

    return reduce_draft_head(context, config, "draft", tokenizer, "draft-model")


def _validate(config: DraftModelConfig, model_config) -> None:
    """Before any weights load: the calibration text must exist if it will be read."""
    from specc.contract.validation import check_calibration_data

    if config.draft_vocab_size > 0:
        check_calibration_data(config.calib_data)


METHOD = MethodDescriptor(
    name="draft-model",
    summary="speculative decoding with a separate small Hugging Face draft model (chain or top-k tree); "
            "pass it with --set draft_model=DIR",
    config_class=DraftModelConfig,
    graphs=lambda config: {
        "target": GraphRecipe(TARGET, lambda c: infrastructure_passes()),
        "draft": GraphRecipe("draft", lambda c: infrastructure_passes(),
                             after_training=lambda c, state: reduced_head_passes(state.get(DRAFT_VOCABULARY_KEY)),
                             drafts_only=True),
    },
    build_runtime=build_runtime,
    train=_train,
    validate=_validate,
    extra_sources=(ExtraSource("draft", "draft_model"),),
    draft_depth=lambda config: config.num_draft_tokens,
)
