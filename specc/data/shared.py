"""Where the project's shared data (prompt sets, text corpora) lives: `../shared/data` beside
the checkout, or `$SPECC_SHARED_DATA`. A fresh clone has none: every reader falls back (built-in
prompts, the standard library's sources) or says what is missing."""

from __future__ import annotations

import os
from pathlib import Path

SHARED_DATA_ENV = "SPECC_SHARED_DATA"


def shared_data_dir() -> Path:
    """`$SPECC_SHARED_DATA`, else `../shared/data` beside the checkout (which may not exist)."""
    override = os.environ.get(SHARED_DATA_ENV)
    if override:
        return Path(override)
    import specc

    return Path(specc.__file__).resolve().parents[2] / "shared" / "data"
