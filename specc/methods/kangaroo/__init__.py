"""Method `kangaroo`: an adapter draft head on a shallow exit of the target (double early exit).

Kangaroo (Liu et al., 2024) drafts with the target's first `l` layers plus
a small trained adapter (input RMSNorm → one attention block with residual
→ final RMSNorm → the target's own LM head; specc keeps layer l's MLP in it
by default, `adapter_mlp`, as EAGLE's draft block), and stops drafting as soon as
the adapter's top-1 probability drops below η. Verification runs only
layers l..L-1 on the stored layer-l exits. Three graphs, all cut from the
target by passes:

- `shallow`: prologue + layers 0..l-1 → the exit hidden state;
- `deep`: exit hidden state → layers l..L-1 → final norm → LM head;
- `adapter`: exit hidden state → adapter → LM head, with its own KV cache.

The adapter is trained inside `specc compile` (`train`), self-
distilled from the frozen target. Beyond the reference code: lossless
sampling (Leviathan for sampled chains, point-mass rejection for trees)
and an optional tree (the adapter's top-k at low-confidence depths).
"""

from __future__ import annotations

from specc.contract.descriptor import TARGET, GraphRecipe, MethodDescriptor, TrainResult
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.kangaroo.config import KangarooConfig
from specc.methods.kangaroo.runtime import build_runtime
from specc.passes.attach_adapter_head import AdapterHeadConfig, AttachAdapterHead
from specc.passes.expose_layer_exit import ExposeLayerExit, LayerExitConfig
from specc.passes.reduce_draft_vocabulary import reduced_head_passes
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY
from specc.train.model_size import sized_head_training

__all__ = ["METHOD", "KangarooConfig"]


def _graphs(config: KangarooConfig) -> dict[str, GraphRecipe]:
    layer = config.exit_layer or None    # None: the pass scales the paper's 2 of 32 to the model
    shallow = LayerExitConfig(layer, keep="shallow")
    deep = LayerExitConfig(layer, keep="deep")
    adapter = AdapterHeadConfig(with_mlp=config.adapter_mlp)
    return {
        "shallow": GraphRecipe(TARGET, lambda c: infrastructure_passes() + [ExposeLayerExit(shallow)]),
        "deep": GraphRecipe(TARGET, lambda c: infrastructure_passes() + [ExposeLayerExit(deep)]),
        "adapter": GraphRecipe(TARGET, lambda c: infrastructure_passes()
                               + [ExposeLayerExit(deep), AttachAdapterHead(adapter)],
                               after_training=lambda c, state: reduced_head_passes(state.get(DRAFT_VOCABULARY_KEY)),
                               drafts_only=True),
    }


def _train(context, config: KangarooConfig, tokenizer) -> TrainResult:
    from specc.methods.kangaroo.train import train_adapter

    return train_adapter(context, config, tokenizer)


METHOD = MethodDescriptor(
    name="kangaroo",
    summary="self-speculation from a shallow exit of the target with a trained adapter head (a copy "
            "of layer l); verification resumes at the exit (chain or top-k tree)",
    config_class=KangarooConfig,
    graphs=_graphs,
    build_runtime=build_runtime,
    train=_train,
    trains_on_device=True,
    validate=lambda config, model_config: _validate(config, model_config),
    draft_depth=lambda config: config.max_draft_steps,
    sized_defaults=lambda model_config: sized_head_training(model_config, KangarooConfig),
)


def _validate(config: KangarooConfig, model_config) -> None:
    """Before any weights load: the exit layer must leave at least one deep layer, and
    the training text must exist."""
    from specc.errors import UsageError
    from specc.contract.validation import check_calibration_data

    layers = getattr(model_config, "num_hidden_layers", None)
    if layers is not None and config.exit_layer >= layers:
        raise UsageError(f"--set exit_layer={config.exit_layer} must be below the model's {layers} layers "
                         f"(1..{layers - 1}; 0 picks one)")
    check_calibration_data(config.calib_data)
