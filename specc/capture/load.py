"""Find and load a Hugging Face checkpoint: a local directory or a hub id."""

from __future__ import annotations

import json
from pathlib import Path

from specc.errors import UsageError
from specc.capture.families import check_supported

DTYPES = ("float32", "bfloat16", "float16")


def resolve_checkpoint(model: str) -> Path:
    """Return a local directory holding the checkpoint named by `model`.

    A checkpoint directory is used as is. A `.gguf` file, or a directory
    holding exactly one `.gguf` file and no config.json, is dequantized once
    into the specc cache (`specc.capture.gguf`) and that checkpoint returned.
    Anything else is treated as a hub id and resolved through the normal
    Hugging Face cache (downloading only where allowed).
    """
    path = Path(model)
    if path.exists():
        if not path.is_dir():
            if path.suffix.lower() == ".gguf":
                return _convert_gguf(path)
            raise UsageError(f"model {model!r} is a file; pass a checkpoint directory or a .gguf file")
        if not (path / "config.json").is_file():
            ggufs = sorted(p for p in path.glob("*.gguf") if p.is_file())
            if len(ggufs) == 1:
                return _convert_gguf(ggufs[0])
            if ggufs:
                raise UsageError(
                    f"model directory {model!r} holds {len(ggufs)} .gguf files "
                    f"({', '.join(p.name for p in ggufs)}); name one, e.g. {str(ggufs[0])!r}"
                )
            raise UsageError(
                f"model directory {model!r} has no config.json; pass a Hugging Face checkpoint directory "
                f"or a .gguf file"
            )
        return path
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise UsageError(f"model directory {model!r} does not exist")
    return _resolve_hub_id(model)


def _convert_gguf(path: Path) -> Path:
    from specc.capture.gguf import convert_gguf

    return convert_gguf(path)


def _resolve_hub_id(model_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - transformers depends on it
        raise UsageError(f"cannot resolve hub id {model_id!r}: huggingface_hub is missing") from exc
    try:
        return Path(snapshot_download(model_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as exc:  # the hub client raises many types for "not here"
        raise UsageError(
            f"model {model_id!r} is not a local directory and is not available in the local "
            f"Hugging Face cache (offline or no connection: {type(exc).__name__}); "
            f"pass a checkpoint directory instead"
        ) from None


def read_model_type(checkpoint: Path) -> str:
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{checkpoint / 'config.json'} is not valid JSON: {exc}") from None
    model_type = config.get("model_type")
    if not model_type:
        raise UsageError(f"{checkpoint / 'config.json'} has no model_type; is this a Hugging Face checkpoint?")
    return model_type


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")


def load_model(checkpoint: Path, dtype: str = "float32"):
    """Load the unmodified HF model in eval mode; trust_remote_code stays off."""
    import torch
    from transformers import AutoModelForCausalLM

    check_supported(read_model_type(checkpoint))
    check_dtype(dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=getattr(torch, dtype), attn_implementation="sdpa", trust_remote_code=False
        )
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load model from {checkpoint}: {exc}") from None
    return model.eval()


_GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(checkpoint: Path):
    """The checkpoint's tokenizer. A tokenizer saved as the generic
    `tokenizers` backend is loaded as that class: AutoTokenizer would
    otherwise rebuild it as the model family's own class (e.g.
    Qwen2Tokenizer) and silently change how text is encoded."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    loader = AutoTokenizer
    if _declared_tokenizer_class(checkpoint) in _GENERIC_TOKENIZER_CLASSES:
        loader = PreTrainedTokenizerFast
    try:
        return loader.from_pretrained(checkpoint, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load a tokenizer from {checkpoint}: {exc}") from None


def _declared_tokenizer_class(checkpoint: Path) -> str | None:
    try:
        return json.loads((checkpoint / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, json.JSONDecodeError):
        return None
