"""The systems an engine is measured against, built from its manifest.

- Hugging Face `generate`, greedy, on the original checkpoint (the papers' baseline);
  on a GPU also with a static cache (`cache_implementation="static"`, which
  Hugging Face compiles itself: its fastest batch-1 decoding);
- Hugging Face prompt-lookup decoding (`prompt_lookup_num_tokens=10`);
- Hugging Face assisted generation with the engine's draft checkpoint, for
  methods that use one;
- the specc `none` engine compiled from the same checkpoint with the same
  backend, dtype and max_seq_len (the compiled autoregressive baseline).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specc.bench.bandwidth import CacheLayout, cache_layout, decode_read_bytes
from specc.bench.systems import (HF_ASSISTED, HF_GREEDY, HF_PROMPT_LOOKUP, HF_STATIC, SPECC_NONE, System,
                                 engine_system, hf_system)
from specc.contract.descriptor import TARGET
from specc.errors import SpeccError, UsageError

PROMPT_LOOKUP_TOKENS = 10


@dataclass
class Baselines:
    systems: list[System]
    model_info: dict
    none_read_bytes: int   # the weights a decode step of the `none` engine reads (the bandwidth bound)
    none_cache_layout: CacheLayout   # and what the cached keys and values of the positions it attends to cost
    notes: list[str] = field(default_factory=list)


def source_checkpoint(manifest: dict) -> Path:
    path = Path(manifest["source_checkpoint"])
    if not (path / "config.json").is_file():
        raise SpeccError(
            f"the engine's source checkpoint {path} is gone (no config.json there); the benchmark needs it "
            f"for the Hugging Face baseline and to compile the autoregressive baseline engine; restore it, "
            f"or recompile the engine from a checkpoint that exists"
        )
    return path


def build_baselines(engine, max_new_tokens: int, workdir: Path, none_engine: Path | None = None) -> Baselines:
    from specc.capture.load import load_model

    manifest = engine.manifest
    checkpoint = source_checkpoint(manifest)
    model = load_model(checkpoint, manifest["dtype"]).to(engine.device)
    systems = [
        hf_system(HF_GREEDY, "HF generate, greedy", model, max_new_tokens),
        *([hf_system(HF_STATIC, "HF generate, static cache", model, max_new_tokens, cache_implementation="static")]
          if engine.device.type == "cuda" else []),
        hf_system(HF_PROMPT_LOOKUP, f"HF prompt lookup ({PROMPT_LOOKUP_TOKENS})", model, max_new_tokens,
                  prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS),
    ]
    notes = []
    assisted, note = _assisted_system(manifest, model, max_new_tokens)
    systems += [assisted] if assisted else []
    notes += [note] if note else []
    none, none_read_bytes, none_cache = _none_system(engine, checkpoint, max_new_tokens, workdir, none_engine)
    systems.append(none)
    model_info = {"checkpoint": str(checkpoint), "model_type": model.config.model_type,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "vocab_size": model.config.vocab_size, "num_layers": model.config.num_hidden_layers,
                  "hidden_size": model.config.hidden_size}
    return Baselines(systems, model_info, none_read_bytes, none_cache, notes)


def _assisted_system(manifest: dict, model, max_new_tokens: int) -> tuple[System | None, str | None]:
    from specc.contract.descriptor import get_method

    sources = get_method(manifest["method"]).extra_sources
    if not sources:
        return None, None
    draft_path = manifest["method_config"].get(sources[0].config_field)
    if not draft_path or not (Path(draft_path) / "config.json").is_file():
        return None, (f"HF assisted generation skipped: the engine's draft checkpoint {draft_path} is gone "
                      f"(the engine keeps its own copy of the draft weights, so it still runs)")
    from specc.capture.load import load_model

    draft = load_model(Path(draft_path), manifest["dtype"]).to(model.device)
    return hf_system(HF_ASSISTED, "HF assisted generation", model, max_new_tokens, assistant=draft), None


def _none_system(engine, checkpoint: Path, max_new_tokens: int, workdir: Path,
                 none_engine: Path | None) -> tuple[System, int, int]:
    from specc.engine.loaded import load_engine

    manifest = engine.manifest
    if none_engine is None:
        from specc.compiler import CompileRequest, compile_engine

        none_engine = workdir / "none"
        compile_engine(CompileRequest(model=str(checkpoint), method="none", output=none_engine,
                                      backend=manifest["backend"], dtype=manifest["dtype"],
                                      max_seq_len=int(manifest["max_seq_len"]), device=str(engine.device),
                                      quantize=quantization_scheme(manifest)))
    baseline = load_engine(none_engine, engine.backend.name, str(engine.device))
    _check_comparable(baseline.manifest, manifest, none_engine)
    return (engine_system(SPECC_NONE, "specc none (compiled AR)", "baseline", baseline, max_new_tokens),
            decode_read_bytes(baseline.context.modules[TARGET]), cache_layout(baseline.context, TARGET))


def _check_comparable(baseline: dict, engine: dict, path: Path) -> None:
    if baseline["method"] != "none":
        raise UsageError(f"the baseline engine {path} uses method {baseline['method']!r}; it must be 'none'")
    for key in ("source_checkpoint", "backend", "dtype", "max_seq_len"):
        if baseline[key] != engine[key]:
            raise UsageError(f"the baseline engine {path} has {key} {baseline[key]!r} but the engine under test "
                             f"has {engine[key]!r}; compile the baseline with the same settings")
    if quantization_scheme(baseline) != quantization_scheme(engine):
        raise UsageError(f"the baseline engine {path} has {quantization_scheme(baseline) or 'unquantized'} weights "
                         f"but the engine under test {quantization_scheme(engine) or 'unquantized'} ones; compile "
                         f"the baseline with the same --quantize")


def quantization_scheme(manifest: dict) -> str | None:
    """The engine's `--quantize` scheme (None: its weights are in its dtype)."""
    return manifest.get("quantization", {}).get("scheme")
