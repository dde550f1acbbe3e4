"""Method `firp`: drafts from pseudo hidden states of future tokens, inside verification.

FIRP (Wu et al., 2024) predicts, at intermediate layers t_1 ≤ … ≤ t_k, the
hidden state of the token i steps ahead from a real token's hidden state
with a trained linear map W_i (d × d, plus bias). The pseudo states run
through the remaining layers beside the real ones, attending to the context
and to the earlier pseudo states, with position id = real position + i; the
target's LM head decodes them into draft tokens. One graph:

- `target`: infrastructure passes, then `insert_pseudo_hidden_projections`
  (inputs `pseudo_source`, `pseudo_step`; parameters `firp_proj.<i>.*`).
  With no pseudo rows it computes exactly the target.

Drafting rides inside verification (`runtime`): each target forward runs
the tree (or the prompt) plus k pseudo rows per anchor node, and the pseudo
logits of the last accepted node are the next round's draft, so the method
has no draft forward at all. Pseudo K/V goes to scratch slots that are never
committed. The projections are trained inside `specc compile` (`train`),
one step after another with the target frozen, towards the target's own
next-token distribution i positions later (teacher-forced, soft labels).
Greedy drafts are a static tree of the per-step top-k (lossless by greedy
verification); sampled chains carry each step's distribution for Leviathan
acceptance.
"""

from __future__ import annotations

from specc.contract.descriptor import TARGET, GraphRecipe, MethodDescriptor, TrainResult
from specc.methods.firp.config import FIRPConfig
from specc.methods.firp.runtime import PseudoRowTarget, PseudoStateDrafter, build_runtime
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.firp.insert_pseudo_hidden_projections import InsertPseudoHiddenProjections

__all__ = ["METHOD", "FIRPConfig", "PseudoRowTarget", "PseudoStateDrafter"]


def target_passes(config: FIRPConfig):
    return [*infrastructure_passes(), InsertPseudoHiddenProjections(config.pass_config())]


def _graphs(config: FIRPConfig) -> dict[str, GraphRecipe]:
    return {"target": GraphRecipe(TARGET, target_passes)}


def _train(context, config: FIRPConfig, tokenizer) -> TrainResult:
    from specc.methods.firp.train import train_projections

    return train_projections(context, config, tokenizer)


def _validate(config: FIRPConfig, model_config) -> None:
    """Before any weights load: the projection layers must fit the model, the training text must exist."""
    from specc.contract.validation import check_calibration_data
    from specc.methods.firp.insert_pseudo_hidden_projections import check_pseudo_layers

    layers = getattr(model_config, "num_hidden_layers", None)
    if layers is not None:
        if layers < 2:
            from specc.errors import UsageError

            raise UsageError(f"firp needs at least 2 decoder layers (a projection layer and one above it); "
                             f"the model has {layers}")
        if config.layers:
            check_pseudo_layers(tuple(config.layers), layers)
    if config.train_steps:
        check_calibration_data(config.calib_data)


METHOD = MethodDescriptor(
    name="firp",
    summary="FIRP: trained linear maps at intermediate layers predict pseudo hidden states of the next k "
            "tokens, which ride through the rest of the target inside the verification forward and draft "
            "the next tree (no draft model, no draft forward)",
    config_class=FIRPConfig,
    graphs=_graphs,
    build_runtime=build_runtime,
    train=_train,
    validate=_validate,
    # A verification runs k pseudo rows per anchor node beside the draft. Under bfloat16's cap of
    # 4 exact rows only k = 1 still verifies a drafted token exactly; larger k is compiled lossy
    # (AOTI, a wide random llama, k = 3: 2 of 10 prompts gave the bfloat16 `none` engine's tokens).
    call_rows_per_node=lambda config: 1 + config.num_steps,
    draft_depth=lambda config: config.steps,
)
