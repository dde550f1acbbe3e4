"""The engine directory layout and manifest, format version 2 (version 1 had
no graph signatures).

    engine/
      manifest.json            format, versions, method + config, passes, graph signatures, checksums
      tokenizer/               the target's tokenizer files (JSON/text)
      weights/<source>.safetensors   weights of each captured model
      weights/added.safetensors      parameters the method trained (if any)
      graphs/<name>.json       each rewritten graph, serialized without pickle
      ir/<name>/NN_<pass>.txt  each graph right after each pass (for inspect)
      compiled/<name>.*        ahead-of-time artifacts of backends that build them (aoti: .pt2,
                               onnx: .onnx, tensorrt: .onnx and .plan); the manifest's `lowered`
                               table gives each graph's packaging seconds and file sizes
"""

from __future__ import annotations

import hashlib
from pathlib import Path

FORMAT_NAME = "specc-engine"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksums(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` except the manifest, by relative path."""
    return {
        str(path.relative_to(root)): sha256_file(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def ir_file_name(index: int, pass_name: str) -> str:
    return f"{index:02d}_{pass_name}.txt"
