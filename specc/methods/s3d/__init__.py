"""Method `s3d`: simultaneous multi-token drafting with mask tokens through a
mid-layer-skipping path, kept lossless by draft-only adapters.

S3D (Zhong & Bharadwaj, 2024) drafts with the target itself, skipping a
symmetric block of middle layers m..n, fed with the last real token
followed by γ-1 mask tokens <M>: one skipping forward predicts the next γ
tokens at once, each draft row attending to the committed prefix's
full-model KV. The paper fine-tunes the shared weights, which changes the
target; here only draft-only parameters learn, so verification runs the
untouched model. Two graphs, both cut from the target by passes:

- `target`: infrastructure passes only; prefills and verifies.
- `draft`: infrastructure passes, then `skip_middle_layers` (the block and
  its cache writes removed), `insert_mask_tokens` (an `is_mask [1, q]`
  input selecting a learned embedding) and `attach_draft_lora` (LoRA on the
  kept layers' attention projections, optionally the MLP, under
  `draft_lora.*`). It shares the target's KV cache (see `drafter`).

The adapters act on every draft row, the root's too (it goes through the
skipping path like the masks), so the kept layers' K/V the draft writes at
the root's slot are the draft's; verification rewrites that slot with the
full model before anything reads it, and the target graph has no adapters.

With `select` (the default) the block and γ are not constants: `select`
pilot-trains every candidate block, times its draft and the target's
verification, and keeps the pair with the largest eq. 12 prediction; the
chosen values replace the config in the manifest, and the engine's draft
graph is built for them.

The mask embedding and the adapters are trained inside `specc compile`
(`train`), self-distilled from the frozen target with masks at every
offset; the manifest state records the skipped block and the held-out
top-1 agreement at each draft position before and after training. Greedy
drafts are the per-position argmax chain (optionally a top-k tree);
sampled chains carry each position's draft distribution for Leviathan
acceptance, so both are lossless.
"""

from __future__ import annotations

from specc.contract.descriptor import TARGET, GraphRecipe, MethodDescriptor, TrainResult
from specc.contract.drafter import MethodRuntime
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.s3d.attach_draft_lora import AttachDraftLora
from specc.methods.s3d.config import S3DConfig
from specc.methods.s3d.drafter import MaskTokenDrafter
from specc.methods.s3d.insert_mask_tokens import InsertMaskTokens
from specc.methods.s3d.skip_middle_layers import SkipMiddleLayers

__all__ = ["METHOD", "S3DConfig", "MaskTokenDrafter"]


def draft_only_passes(config: S3DConfig):
    """What cuts the draft from a graph that already has the infrastructure passes."""
    return [SkipMiddleLayers(config.skip_config()), InsertMaskTokens(), AttachDraftLora(config.lora_config())]


def draft_passes(config: S3DConfig):
    return [*infrastructure_passes(), *draft_only_passes(config)]


def _graphs(config: S3DConfig) -> dict[str, GraphRecipe]:
    return {
        "target": GraphRecipe(TARGET, lambda c: infrastructure_passes()),
        "draft": GraphRecipe(TARGET, draft_passes, drafts_only=True),
    }


def _build_runtime(context, config: S3DConfig) -> MethodRuntime:
    """The target owns the KV cache; the draft graph writes into the same one."""
    target = context.model("target")
    return MethodRuntime(target, MaskTokenDrafter(context.model("draft", cache=target.cache), config))


def _train(context, config: S3DConfig, tokenizer) -> TrainResult:
    from specc.methods.s3d.train import train_draft

    return train_draft(context, config, tokenizer)


def _validate(config: S3DConfig, model_config) -> None:
    """Before any weights load: the skipped block must keep the first and last layer,
    and the training text must exist."""
    from specc.errors import UsageError
    from specc.contract.validation import check_calibration_data

    layers = getattr(model_config, "num_hidden_layers", None)
    if layers is not None and config.skip_layers and config.skip_layers[1] > layers - 2:
        raise UsageError(f"--set skip_layers={config.skip_layers[0]},{config.skip_layers[1]} must keep the last "
                         f"layer of the model's {layers}: first,last with 1 <= first <= last <= {layers - 2}")
    if config.train_steps:
        check_calibration_data(config.calib_data)


METHOD = MethodDescriptor(
    name="s3d",
    summary="S3D: one forward of the target with its middle layers skipped, fed γ-1 mask tokens, drafts γ "
            "tokens at once; draft-only LoRA and mask embedding trained at compile time (chain or top-k tree)",
    config_class=S3DConfig,
    graphs=_graphs,
    build_runtime=_build_runtime,
    train=_train,
    validate=_validate,
    draft_depth=lambda config: config.draft_tokens,
)
