"""The `config.json` of an exported EAGLE-3 draft: a one-layer Llama config the loaders read.

Shapes come from the engine (the manifest's architecture summary and the trained
tensors); what the manifest does not record (RMSNorm epsilon, RoPE, context
length, activation) comes from the target checkpoint's own config.json, the
engine's `source_checkpoint` or `--target-config`, since the draft layer must
rotate and normalise exactly as the target it was trained against.

The three fused layers are written twice, because the loaders count them
differently (docs/export.md has the lines):
- `eagle_aux_hidden_state_layer_ids` (top level) for vLLM, read first there
  (gpu_model_runner.py); vLLM's id j is the residual stream entering layer j,
  the same as specc's `fused_layers`;
- `eagle_config.eagle_aux_hidden_state_layer_ids` for SGLang, the only place it
  reads them (spec_aux_hidden_state.py); SGLang's id j means the output of layer
  j and captures layer j + 1's input (llama.py set_eagle3_layers_to_capture), so
  these are `fused_layers - 1`. vLLM reads the nested list only when the top-level
  one is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

from specc.errors import UsageError
from specc.export.eagle3 import Eagle3Draft
from specc.export.engine_files import EngineFiles

ARCHITECTURE = "LlamaForCausalLMEagle3"
DEFAULT_ROPE_THETA = 10000.0   # transformers' default for llama, mistral, qwen2 and qwen3 configs
DEFAULT_HIDDEN_ACT = "silu"    # likewise; the loaders' Llama MLP supports nothing else
COPIED = ("bos_token_id", "eos_token_id", "pad_token_id")


def read_target_config(engine: EngineFiles, override: Path | None) -> tuple[dict | None, Path | None]:
    """The target checkpoint's config.json (from `override`, a file or a directory, else the
    engine's source checkpoint) and where it was read; (None, None) when the source is gone."""
    if override is not None:
        path = override / "config.json" if override.is_dir() else override
        if not path.is_file():
            raise UsageError(f"--target-config {override}: no such file; pass the target checkpoint's config.json "
                             f"or its directory")
    else:
        source = engine.manifest.get("source_checkpoint")
        path = Path(source) / "config.json" if source else None
        if path is None or not path.is_file():
            return None, None
    try:
        return json.loads(path.read_text()), path
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read the target config {path} ({exc}); pass a readable one with "
                         f"--target-config PATH") from None


def eagle3_config(draft: Eagle3Draft, engine: EngineFiles, target: dict | None, target_path: Path | None) -> dict:
    arch = engine.target_architecture()
    source = target if target is not None else {}
    if target is not None:
        _check_describes_engine(target, target_path, arch)
    rope_theta, rope_scaling = _rope(source)
    known = {"rms_norm_eps": source.get("rms_norm_eps", arch.get("rms_norm_eps")),
             "rope_theta": rope_theta if target is not None else arch.get("rope_theta"),
             "max_position_embeddings": source.get("max_position_embeddings",
                                                   arch.get("max_position_embeddings"))}
    missing = [name for name, value in known.items() if value is None]
    if missing:
        where = (f"the target config {target_path} has no {', '.join(missing)}" if target is not None else
                 f"the engine's source checkpoint ({engine.manifest.get('source_checkpoint')}) has no readable "
                 f"config.json and the manifest does not record {', '.join(missing)}")
        raise UsageError(f"{where}; pass the target checkpoint's config.json with --target-config PATH")
    hidden_act = source.get("hidden_act", DEFAULT_HIDDEN_ACT)
    if hidden_act != DEFAULT_HIDDEN_ACT:
        raise UsageError(f"the target's hidden_act is {hidden_act!r}; the EAGLE-3 loaders' Llama draft MLP supports "
                         f"only {DEFAULT_HIDDEN_ACT!r}")
    d = draft.dims
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": d.hidden,
        "intermediate_size": d.intermediate,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": hidden_act,
        "rms_norm_eps": known["rms_norm_eps"],
        "rope_theta": known["rope_theta"],
        "rope_scaling": rope_scaling if target is not None else arch.get("rope_scaling"),
        "max_position_embeddings": known["max_position_embeddings"],
        "attention_bias": draft.attention_bias,
        "mlp_bias": False,
        "vocab_size": d.vocab,
        "draft_vocab_size": draft.draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": engine.manifest["dtype"],
        **{key: source[key] for key in COPIED if key in source},
        "eagle_aux_hidden_state_layer_ids": list(draft.fused_layers),
        "eagle_config": {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [layer - 1 for layer in draft.fused_layers],
        },
    }


def _rope(config: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) in the layout every transformers version reads (version 5 turns
    them into `rope_parameters`), from a config written in either layout."""
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict):
        theta = parameters.get("rope_theta", config.get("rope_theta", DEFAULT_ROPE_THETA))
        scaling = {k: v for k, v in parameters.items() if k != "rope_theta"}
        return theta, scaling if scaling.get("rope_type", "default") != "default" else None
    return config.get("rope_theta", DEFAULT_ROPE_THETA), config.get("rope_scaling")


def _check_describes_engine(target: dict, path: Path | None, arch: dict) -> None:
    for key, arch_key in (("hidden_size", "hidden_size"), ("num_attention_heads", "num_attention_heads"),
                          ("num_hidden_layers", "num_layers"), ("vocab_size", "vocab_size")):
        if key in target and target[key] != arch[arch_key]:
            raise UsageError(f"the target config {path} has {key}={target[key]}, but the engine's target has "
                             f"{arch[arch_key]}: it describes another model; pass the config of the checkpoint the "
                             f"engine was compiled from with --target-config PATH")
