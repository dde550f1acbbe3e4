"""Deterministic reference models: small Llama/Qwen2 checkpoints trained from scratch on CPU.

``build_reference_model("small")`` returns a directory that
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``
load. Built checkpoints are cached under
``$SPECC_CACHE_DIR/refmodels/<name>-<key>/`` (default ``~/.cache/specc``), where
the key hashes the spec, the corpus contents and the trainer version; a cached
checkpoint is reused instead of retrained.

Importing this package does not import torch; building does.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from specc.data.files import CACHE_ENV, cache_root  # noqa: F401  (CACHE_ENV re-exported)
from specc.errors import UsageError
from specc.data.corpora import CorpusSelection, heldout_prompts, select_corpus
from specc.refmodels.specs import (
    REFERENCE_FILE,
    REFERENCE_MODELS,
    TRAINER_VERSION,
    CorpusPlan,
    ModelShape,
    ReferenceSpec,
    TokenizerSpec,
    TrainingPlan,
    parameter_count,
)

__all__ = [
    "REFERENCE_MODELS",
    "CorpusPlan",
    "ModelShape",
    "ReferenceSpec",
    "TokenizerSpec",
    "TrainingPlan",
    "build_from_spec",
    "build_reference_model",
    "cached_checkpoint",
    "default_cache_dir",
    "get_spec",
    "heldout_prompts",
    "parameter_count",
    "read_reference",
]

log = logging.getLogger(__name__)

_CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def build_reference_model(
    name: str,
    cache_dir: Path | None = None,
    progress: bool = True,
    *,
    force: bool = False,
    device: str | None = None,
    threads: int | None = None,
) -> Path:
    """The checkpoint directory of the named reference model, training it if not cached."""
    return build_from_spec(get_spec(name), cache_dir, progress, force=force, device=device, threads=threads)


def build_from_spec(
    spec: ReferenceSpec,
    cache_dir: Path | None = None,
    progress: bool = True,
    *,
    force: bool = False,
    device: str | None = None,
    threads: int | None = None,
) -> Path:
    """Like `build_reference_model` for a spec that need not be registered.

    ``cache_dir`` holds the ``<name>-<key>`` checkpoint directories directly.
    ``device`` defaults to CUDA when available, else CPU. ``threads``: torch's
    CPU threads (default: specc's thread policy, `specc.host.threads`). On CPU the
    thread count changes the summation order of the matmuls and so the trained
    weights, so it is part of the cache key.
    """
    selection = _select_corpus(spec)
    cpu_threads = _training_threads(device, threads)
    key = cache_key(spec, selection, cpu_threads)
    destination = Path(cache_dir or default_cache_dir()) / f"{spec.name}-{key}"
    if not force and cached_checkpoint(destination, key):
        log.info("reusing cached reference model %s", destination)
        return destination
    from specc.refmodels.train import train_reference_model

    train_reference_model(
        spec, selection, destination, cache_key=key, progress=progress, device=device
    )
    return destination


def get_spec(name: str) -> ReferenceSpec:
    try:
        return REFERENCE_MODELS[name]
    except KeyError:
        choices = ", ".join(REFERENCE_MODELS)
        raise UsageError(f"unknown reference model {name!r}; choose from: {choices}") from None


def default_cache_dir() -> Path:
    return cache_root() / "refmodels"


def cache_key(spec: ReferenceSpec, selection: CorpusSelection, cpu_threads: int | None = None) -> str:
    ingredients = {
        "spec": spec.fingerprint(),
        "corpus": selection.fingerprint(),
        "trainer_version": TRAINER_VERSION,
    }
    if cpu_threads is not None:
        ingredients["cpu_threads"] = cpu_threads
    return hashlib.sha256(json.dumps(ingredients, sort_keys=True).encode()).hexdigest()[:16]


def _training_threads(device: str | None, threads: int | None) -> int | None:
    """Apply the thread policy; the count when training runs on the CPU (it shapes the weights), else None."""
    import torch

    from specc.host.threads import apply_threads

    count = apply_threads(threads)
    on_cpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cpu")
    return count if on_cpu else None


def cached_checkpoint(directory: Path, key: str) -> bool:
    """Whether ``directory`` holds a complete checkpoint built for ``key``."""
    reference = read_reference(directory)
    if reference is None or reference.get("cache_key") != key:
        return False
    return all((directory / name).is_file() for name in _CHECKPOINT_FILES)


def read_reference(directory: Path) -> dict | None:
    """The parsed ``specc_reference.json`` of a checkpoint, or None if absent or unreadable."""
    try:
        return json.loads((Path(directory) / REFERENCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _select_corpus(spec: ReferenceSpec) -> CorpusSelection:
    return select_corpus(
        code_bytes=spec.corpus.code_bytes,
        text_bytes=spec.corpus.text_bytes,
        tokenizer_code_bytes=spec.tokenizer.code_bytes,
        tokenizer_text_bytes=spec.tokenizer.text_bytes,
    )
