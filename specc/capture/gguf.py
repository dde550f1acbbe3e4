"""GGUF input: dequantize a GGUF file once into a Hugging Face checkpoint directory.

`convert_gguf(path)` reads the file's metadata with `gguf.GGUFReader` (refusing
an architecture or tensor type specc cannot take before any heavy work),
loads it with transformers' GGUF reader, which dequantizes every tensor to
float32, and writes a plain checkpoint (config, safetensors weights,
generation config, tokenizer with its chat template) under
``<cache>/gguf/<sha256[:16]>/``. The cache root is the one the reference
models use (``$SPECC_CACHE_DIR``, default ``~/.cache/specc``). The directory
is built beside its final place and renamed into it, and reused whenever
it is already there for the same file contents.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specc.capture.families import SUPPORTED_FAMILIES, check_supported
from specc.errors import SpeccError, UsageError

# GGUF `general.architecture` values specc converts: llama.cpp names these
# families as Hugging Face does (Mistral files usually say "llama", which
# transformers maps to mistral by the model name), but for Gemma 3, whose
# text-only model Hugging Face calls gemma3_text.
GGUF_ARCHITECTURE_NAMES = {"gemma3_text": "gemma3"}
SUPPORTED_ARCHITECTURES = tuple(GGUF_ARCHITECTURE_NAMES.get(f, f) for f in SUPPORTED_FAMILIES)
# Tensor types `gguf.dequantize` turns into float32.
SUPPORTED_TENSOR_TYPES = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)
MARKER_FILE = "specc_gguf.json"     # written into every conversion; names the source and its sha256
CONVERTER_VERSION = 2               # part of the marker: bump when the output changes for the same file
HEAD_TENSORS = ("output.weight", "token_embd.weight")   # the LM head's matrix: its own, else the tied embedding
_CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    tensor_types: tuple[str, ...]   # distinct types, most common first
    name: str | None
    head_type: str | None = None    # the type the file stores the LM head's matrix in


def gguf_cache_dir() -> Path:
    """``<cache root>/gguf``: beside the reference models' ``refmodels`` folder."""
    from specc.data.files import cache_root

    return cache_root() / "gguf"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_gguf_info(path: Path) -> GGUFInfo:
    """The architecture and tensor types of a GGUF file; a UsageError if it is not one."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UsageError("reading GGUF files needs the 'gguf' package: pip install gguf accelerate") from None
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise UsageError(f"{path} is not a readable GGUF file ({exc})") from None
    architecture = _string_field(reader, "general.architecture")
    if not architecture:
        raise UsageError(f"{path} has no general.architecture in its GGUF metadata")
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    types = tuple(sorted(counts, key=lambda t: -counts[t]))
    by_name = {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}
    head_type = next((by_name[name] for name in HEAD_TENSORS if name in by_name), None)
    return GGUFInfo(architecture, types, _string_field(reader, "general.name"), head_type)


def check_gguf_supported(path: Path, info: GGUFInfo) -> None:
    if info.architecture not in SUPPORTED_ARCHITECTURES:
        raise UsageError(
            f"unsupported GGUF architecture {info.architecture!r} in {path.name}: specc converts "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}; pass a GGUF file of one of these families"
        )
    unsupported = [t for t in info.tensor_types if t not in SUPPORTED_TENSOR_TYPES]
    if unsupported:
        raise UsageError(
            f"unsupported GGUF quantization type {', '.join(unsupported)} in {path.name}: specc dequantizes "
            f"{', '.join(SUPPORTED_TENSOR_TYPES)}; pass a GGUF file quantized with one of these"
        )


def converted_head_type(directory: str | Path) -> str | None:
    """The GGUF type the LM head was stored in, for a checkpoint converted from a GGUF file
    (None for any other checkpoint)."""
    try:
        return json.loads((Path(directory) / MARKER_FILE).read_text()).get("head_type")
    except (OSError, ValueError):
        return None


def cached_conversion(directory: Path, sha256: str) -> bool:
    """Whether ``directory`` holds a complete conversion of the file with this sha256."""
    try:
        marker = json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("sha256") != sha256 or marker.get("converter_version") != CONVERTER_VERSION:
        return False
    return all((directory / name).is_file() for name in _CHECKPOINT_FILES)


def convert_gguf(path: str | Path, cache_dir: Path | None = None, *, progress: bool = True,
                 sha256: str | None = None) -> Path:
    """The Hugging Face checkpoint directory converted from the GGUF file ``path``.

    Converted once per file contents (keyed by sha256) and reused afterwards.
    ``cache_dir`` replaces ``<cache root>/gguf``; ``sha256``, when the caller
    has already hashed the file, saves hashing it again.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"GGUF file {str(path)!r} does not exist")
    sha256 = sha256 or file_sha256(path)
    destination = Path(cache_dir or gguf_cache_dir()) / sha256[:16]
    if cached_conversion(destination, sha256):
        return destination
    from specc.capture.gguf_reads import shared_gguf_reads
    from specc.data.files import write_directory_atomically

    with shared_gguf_reads():
        info = read_gguf_info(path)
        check_gguf_supported(path, info)
        if progress:
            size = path.stat().st_size / 1e6
            print(f"specc: converting {path.name} ({info.architecture}, {'/'.join(info.tensor_types)}, "
                  f"{size:.{0 if size >= 10 else 2}f} MB) to a float32 checkpoint in {destination} (once; this takes "
                  f"a while) ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        write_directory_atomically(destination, lambda staging: _write_checkpoint(path, info, sha256, staging))
    if progress:
        print(f"specc: converted {path.name} in {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
    return destination


def _write_checkpoint(path: Path, info: GGUFInfo, sha256: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except ImportError as exc:
        raise UsageError(f"reading GGUF files needs the 'gguf' and 'accelerate' packages ({exc}); "
                         f"pip install gguf accelerate") from None
    except (OSError, ValueError, NotImplementedError) as exc:
        raise SpeccError(f"transformers could not load {path}: {exc}") from None
    check_supported(loaded.config.model_type)
    # transformers will not save a model loaded from GGUF: copy the float32
    # weights into a plain model built from the same config, minus the GGUF note.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(loaded.config).from_dict(config_dict)
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.eval().save_pretrained(out)
    del loaded, plain
    tokenizer.save_pretrained(out)
    marker = {
        "source": path.name,
        "source_path": str(path.resolve()),   # what llama.cpp runs beside the engine (specc bench --baseline)
        "sha256": sha256,
        "architecture": info.architecture,
        "model_type": config.model_type,
        "tensor_types": list(info.tensor_types),
        "head_type": info.head_type,   # `--quantize q4` keeps the LM head at 6 bits only where this has at most 6
        "general_name": info.name,
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "converter_version": CONVERTER_VERSION,
    }
    (out / MARKER_FILE).write_text(json.dumps(marker, indent=1) + "\n")
    for written in out.iterdir():
        written.chmod(0o644)    # safetensors writes private files; a cache may be shared


def _string_field(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        value = field.contents()
    except Exception:   # an older gguf without contents(): decode the raw parts
        value = bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return value if isinstance(value, str) else None
