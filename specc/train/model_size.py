"""Training lengths that follow the model's size, so that compile-time training at a method's
defaults takes about as long on a 1.5B model as on a small one.

The teacher pass (the frozen target once per window) and every training step through the
target's width cost about in proportion to the parameters in the target's layers. A method
whose defaults were measured on models up to `REFERENCE_PARAMETERS` declares, through
`MethodDescriptor.sized_defaults`, which of its fields shrink in proportion above that size;
a field the user sets is never changed (`specc.compiler.validate`).
"""

from __future__ import annotations

from dataclasses import fields

REFERENCE_PARAMETERS = 450_000_000   # layer parameters up to which the built-in training defaults hold as declared


def layer_parameters(model_config) -> int:
    """About how many parameters a checkpoint's decoder layers hold (attention and a gated MLP;
    no embeddings, no LM head), from its Hugging Face config alone: what a forward reads per token."""
    config = getattr(model_config, "text_config", None) or model_config
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * config.intermediate_size
    return config.num_hidden_layers * (attention + mlp)


def scaled_to_model(default: int, model_config, floor: int) -> int:
    """`default`, measured on models up to `REFERENCE_PARAMETERS`, shrunk in proportion to a larger
    model's layer parameters, and never below `floor`."""
    parameters = layer_parameters(model_config)
    if parameters <= REFERENCE_PARAMETERS:
        return default
    return max(floor, round(default * REFERENCE_PARAMETERS / parameters))


def sized_training(model_config, config_class, floors: dict[str, int]) -> dict[str, int]:
    """The declared defaults of `config_class`'s fields named in `floors`, scaled to the model."""
    defaults = {field.name: field.default for field in fields(config_class)}
    return {name: scaled_to_model(defaults[name], model_config, floor) for name, floor in floors.items()}
