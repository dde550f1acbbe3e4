"""Where specc caches files, and writing a directory so readers never see it half-made."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable

CACHE_ENV = "SPECC_CACHE_DIR"


def cache_root() -> Path:
    """`$SPECC_CACHE_DIR`, else `~/.cache/specc`: reference models, converted GGUF checkpoints."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specc")


def write_directory_atomically(destination: Path, write_contents: Callable[[Path], None]) -> None:
    """Fill a staging directory beside ``destination``, then swap it into place.

    Readers see either no directory, the previous one, or the complete new one.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent))
    try:
        write_contents(staging)
        os.chmod(staging, 0o755)  # mkdtemp makes it private; a cache may be shared
        _swap_into_place(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_into_place(staging: Path, destination: Path) -> None:
    try:
        os.replace(staging, destination)
        return
    except OSError:
        if not destination.exists():
            raise
    # os.replace cannot overwrite a non-empty directory: retire the old one first.
    retired = destination.with_name(f".{destination.name}.{uuid.uuid4().hex}.old")
    os.replace(destination, retired)
    os.replace(staging, destination)
    shutil.rmtree(retired, ignore_errors=True)
