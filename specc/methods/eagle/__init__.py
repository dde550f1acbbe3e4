"""Method `eagle`: an EAGLE-3 draft head trained at compile time, drafting an EAGLE-2 dynamic tree.

EAGLE-3 (Li et al., 2025) drafts with one decoder layer that reads the token's
embedding beside a feature fused from a low, a middle and a high layer of the
target, and is trained by self-distillation with "training-time test": unrolled
on its own predictions, so its second and third drafts stay good. EAGLE-2 (Li et
al., 2024) grows the draft tree by cumulative draft probability instead of a
fixed shape. Two graphs, both cut from the target by passes:

- `target`: the target with one more output, each row's fused feature
  (`expose_fused_features`: W_fc over the states entering the three layers);
- `head`: the draft head (`attach_eagle_head`: the target's last layer as a
  template, its attention reading [norm(embedding), norm(feature)]), with its own KV
  cache and, after training, an LM head over the most frequent tokens.

The plain target verifies, so the method is lossless wherever the target graph is
exact (chains only under bfloat16's exact-rows budget). `lookup=true` adds the
n-gram continuation of the context as a second branch of the same tree, and
`lookup_corpus` the continuations of text the target wrote elsewhere as another,
as for every method whose drafter composes (`specc.engine.composition`).
"""

from __future__ import annotations

from specc.contract.descriptor import TARGET, GraphRecipe, MethodDescriptor, TrainResult
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.eagle.attach_eagle_head import AttachEagleHead
from specc.methods.eagle.config import EagleConfig, parse_layers
from specc.methods.eagle.expose_fused_features import ExposeFusedFeatures, FusedFeaturesConfig
from specc.methods.eagle.runtime import build_runtime
from specc.passes.reduce_draft_vocabulary import reduced_head_passes
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY
from specc.train.model_size import sized_head_training

__all__ = ["METHOD", "EagleConfig"]


def _graphs(config: EagleConfig) -> dict[str, GraphRecipe]:
    fused = FusedFeaturesConfig(parse_layers(config.fused_layers))
    return {
        "target": GraphRecipe(TARGET, lambda c: infrastructure_passes() + [ExposeFusedFeatures(fused)]),
        "head": GraphRecipe(TARGET, lambda c: infrastructure_passes() + [AttachEagleHead()],
                            after_training=lambda c, state: reduced_head_passes(state.get(DRAFT_VOCABULARY_KEY)),
                            drafts_only=True),
    }


def _train(context, config: EagleConfig, tokenizer) -> TrainResult:
    from specc.methods.eagle.train import train_head

    return train_head(context, config, tokenizer)


def _validate(config: EagleConfig, model_config) -> None:
    """Before any weights load: the fused layers must exist, and the training text too."""
    from specc.contract.validation import check_calibration_data
    from specc.errors import UsageError

    layers = getattr(model_config, "num_hidden_layers", None)
    chosen = parse_layers(config.fused_layers)
    if layers is not None and layers < 2:
        raise UsageError(f"eagle needs a target with at least 2 decoder layers; this one has {layers}")
    if layers is not None and chosen is not None and max(chosen) > layers:
        raise UsageError(f"--set fused_layers={config.fused_layers} must name layers 1..{layers} of the model's "
                         f"{layers} (t: the state entering layer t; {layers}: the last layer's output)")
    check_calibration_data(config.calib_data)


METHOD = MethodDescriptor(
    name="eagle",
    summary="an EAGLE-3 draft head (fused low/mid/high features, one decoder layer, training-time test) "
            "trained at compile time; EAGLE-2 dynamic tree, optionally shared with prompt lookup",
    config_class=EagleConfig,
    graphs=_graphs,
    build_runtime=build_runtime,
    train=_train,
    trains_on_device=True,
    validate=_validate,
    draft_depth=lambda config: config.depth,
    sized_defaults=lambda model_config: sized_head_training(model_config, EagleConfig),
)
