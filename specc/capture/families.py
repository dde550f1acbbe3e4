"""The model families specc captures, read from Hugging Face configs.

One table maps each supported `model_type` to what the runtime must know
about it, so no modeling code is forked: everything else comes from the
exported graph and the config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specc.errors import UsageError

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text")


@dataclass(frozen=True)
class ArchitectureSummary:
    """The shape facts the runtime needs: cache layout, vocabulary, stop tokens."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None

    def to_json(self) -> dict:
        data = asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "ArchitectureSummary":
        return cls(**{**data, "eos_token_ids": tuple(data["eos_token_ids"])})


def check_supported(model_type: str) -> None:
    if model_type not in SUPPORTED_FAMILIES:
        raise UsageError(
            f"unsupported architecture {model_type!r}: specc captures "
            f"{', '.join(SUPPORTED_FAMILIES)}; pass a checkpoint of one of these families"
        )


def summarize_architecture(config, generation_config=None) -> ArchitectureSummary:
    check_supported(config.model_type)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ArchitectureSummary(
        model_type=config.model_type,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        eos_token_ids=_eos_token_ids(config, generation_config),
        sliding_window=_active_sliding_window(config),
    )


def _eos_token_ids(config, generation_config) -> tuple[int, ...]:
    source = generation_config if generation_config is not None else config
    eos = getattr(source, "eos_token_id", None)
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def _active_sliding_window(config) -> int | None:
    """The window every layer attends through, which the runtime applies to the one mask it
    builds; None when no layer has one, or when layers differ (`layer_windows` then says which)."""
    if layer_windows(config) is not None:
        return None
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    # qwen2/qwen3 carry a window but only use it when this flag is on.
    if hasattr(config, "use_sliding_window") and not config.use_sliding_window:
        return None
    if set(getattr(config, "layer_types", None) or ()) == {"full_attention"}:
        return None
    return int(window)


def layer_windows(config) -> tuple[int | None, ...] | None:
    """Each decoder layer's sliding window (None: full attention) when the checkpoint mixes
    attention kinds across layers (`layer_types`: Gemma 2/3, GPT-OSS, Qwen2 with
    max_window_layers); None when every layer attends alike. The graph windows those layers
    itself (`specc.passes.window_sliding_layers`), from the one mask the runtime builds."""
    kinds = list(getattr(config, "layer_types", None) or ())
    if len(set(kinds)) < 2:
        return None
    unknown = set(kinds) - {"sliding_attention", "full_attention"}
    if unknown:
        raise UsageError(f"this {config.model_type} checkpoint has layers of attention kind "
                         f"{', '.join(sorted(unknown))}: specc serves full and sliding-window attention only")
    window = getattr(config, "sliding_window", None)
    if window is None:
        raise UsageError(f"this {config.model_type} checkpoint has sliding_attention layers but no sliding_window")
    return tuple(int(window) if kind == "sliding_attention" else None for kind in kinds)
