"""Training settings that follow the model's size: lengths, so that compile-time training at a
method's defaults takes about as long on a 1.5B model as on a small one, and the learning rate
of a head as wide as the target, which the built-in defaults tuned on a narrow model.

The teacher pass (the frozen target once per window) and every training step through the
target's width cost about in proportion to the parameters in the target's layers. A method
whose defaults were measured on models up to `REFERENCE_PARAMETERS` declares, through
`MethodDescriptor.sized_defaults`, which of its fields shrink in proportion above that size;
a field the user sets is never changed (`specc.compiler.validate`).
"""

from __future__ import annotations

from dataclasses import fields

REFERENCE_PARAMETERS = 450_000_000   # layer parameters up to which the built-in training defaults hold as declared
REFERENCE_WIDTH = 576                # hidden size the built-in learning rates were tuned at (SmolLM2-135M)
HEAD_TRAINING_FLOORS = {"train_windows": 128, "train_steps": 300}


def _text_config(model_config):
    return getattr(model_config, "text_config", None) or model_config


def layer_parameters(model_config) -> int:
    """About how many parameters a checkpoint's decoder layers hold (attention and a gated MLP;
    no embeddings, no LM head), from its Hugging Face config alone: what a forward reads per token."""
    config = _text_config(model_config)
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
    defaults = declared_defaults(config_class)
    return {name: scaled_to_model(defaults[name], model_config, floor) for name, floor in floors.items()}


def declared_defaults(config_class) -> dict:
    """Every field's default as the config class declares it."""
    return {field.name: field.default for field in fields(config_class)}


def width_scaled_learning_rate(default: float, model_config) -> float:
    """`default`, tuned for a head of `REFERENCE_WIDTH`, scaled down as 1/width for a wider model:
    Adam's step moves each weight by about the learning rate, so a wider layer's output moves in
    proportion to its width."""
    width = _text_config(model_config).hidden_size
    return default if width <= REFERENCE_WIDTH else default * REFERENCE_WIDTH / width


def model_size(model_config) -> str:
    """What the scaling above reads, for messages."""
    return (f"{layer_parameters(model_config) / 1e9:.2f}B parameters in its layers, hidden size "
            f"{_text_config(model_config).hidden_size}")


def sized_head_training(model_config, config_class, floors: dict[str, int] = HEAD_TRAINING_FLOORS) -> dict:
    """For a method that trains a head as wide as its target: the teacher's windows and the steps
    scaled to the model's size (never below `floors`), and the learning rate scaled to its width."""
    rate = width_scaled_learning_rate(declared_defaults(config_class)["learning_rate"], model_config)
    return {**sized_training(model_config, config_class, floors), "learning_rate": rate}
