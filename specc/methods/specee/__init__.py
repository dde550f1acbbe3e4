"""Method `specee`: speculative early exit (Xu et al., 2025) as graph passes.

A draft head (EAGLE-1 style: the previous token's top-layer feature and
the token's embedding → a projection → one decoder block → the target's
LM head) proposes K candidates for each token; after scheduled decoder
layers a small predictor reads the candidates' logits (the reduced LM
head), their softmax and its change since the layer below, and when it
fires and the full head's argmax at that layer is a candidate, the token
leaves there. Three graphs, all cut from the target by passes:

- `verify`: the full target, also returning its top-layer hidden state;
- `layerwise`: the target with exit predictors after every layer from 1
  to L-2, one segment per layer, stepped by the runtime;
- `draft_head`: the draft head, with its own KV cache (in tree mode also
  returning its block's output, the stand-in feature for deeper levels).

Modes: `ar` (the paper's public path, lossy), `lossless` (early-exit
tokens are drafts the full model verifies) and `tree` (the paper's tree
mode, lossy: each path of a drafted token tree is a hyper-token that
leaves the layer-stepped forward at the deepest exit its tokens need).
The predictors, the draft head and the offline exit schedule are
trained/measured inside `specc compile`.
"""

from __future__ import annotations

from specc.lower.backend import RUN_TIME_SEGMENTS
from specc.contract.descriptor import TARGET, GraphRecipe, MethodDescriptor, TrainResult
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.specee.config import DRAFT_VOCABULARY_KEY, REDUCED_HEAD, SpecEEConfig
from specc.methods.specee.runtime import build_runtime
from specc.methods.specee.attach_draft_head import AttachDraftHead
from specc.methods.specee.expose_final_hidden import ExposeFinalHidden
from specc.methods.specee.insert_exit_predictors import ExitPredictorConfig, InsertExitPredictors
from specc.passes.reduce_draft_vocabulary import reduced_head_passes
from specc.methods.specee.segment_by_layer import SegmentByLayer

__all__ = ["METHOD", "SpecEEConfig"]


def _graphs(config: SpecEEConfig) -> dict[str, GraphRecipe]:
    return {
        "verify": GraphRecipe(TARGET, lambda c: infrastructure_passes() + [ExposeFinalHidden()]),
        "layerwise": GraphRecipe(TARGET, lambda c: infrastructure_passes()
                                 + [InsertExitPredictors(_predictors(config)), SegmentByLayer()]),
        "draft_head": GraphRecipe(TARGET, lambda c: infrastructure_passes() + _head_features(config)
                                  + [AttachDraftHead()],
                                  after_training=lambda c, state: reduced_head_passes(
                                      state.get(DRAFT_VOCABULARY_KEY), module_name=REDUCED_HEAD),
                                  drafts_only=True),
    }


def _head_features(config: SpecEEConfig) -> list:
    """Tree mode drafts several levels: exposing the top layer's output before the head is cut from
    the target makes the head return its own block's output (EAGLE's next-level feature)."""
    return [ExposeFinalHidden()] if config.mode == "tree" else []


def _predictors(config: SpecEEConfig) -> ExitPredictorConfig:
    first = config.first_exit_layer or None     # None: the pass picks a third of the way up
    return ExitPredictorConfig(first_layer=first, candidates=config.candidates, hidden=config.predictor_hidden,
                               seed=config.seed)


def _train(context, config: SpecEEConfig, tokenizer) -> TrainResult:
    from specc.methods.specee.train import train_specee

    return train_specee(context, config, tokenizer)


def _validate(config: SpecEEConfig, model_config) -> None:
    from specc.errors import UsageError
    from specc.contract.validation import check_calibration_data

    layers = getattr(model_config, "num_hidden_layers", None)
    if layers is not None and layers < 3:
        raise UsageError(f"specee needs at least 3 decoder layers (an exit needs a layer below and above "
                         f"it); this model has {layers}")
    check_calibration_data(config.calib_data)


METHOD = MethodDescriptor(
    name="specee",
    summary="speculative early exit: a draft head's top-K candidates, exit predictors after scheduled "
            "layers; mode=lossless verifies early-exit tokens, mode=ar (the paper's) does not, mode=tree "
            "(the paper's tree mode) exits each drafted path at its tokens' deepest exit",
    config_class=SpecEEConfig,
    graphs=_graphs,
    build_runtime=build_runtime,
    lossless_when=lambda config: config.mode == "lossless",
    requires=frozenset({RUN_TIME_SEGMENTS}),
    train=_train,
    validate=_validate,
    draft_depth=lambda config: config.max_draft_steps,
)
