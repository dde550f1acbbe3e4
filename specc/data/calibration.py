"""What a `calib_data` setting names: one source, or several comma-separated ones that mix."""

from __future__ import annotations

from pathlib import Path

from specc.errors import UsageError

BUILTIN = "builtin"     # the built-in corpus, as one of several comma-separated sources


def calibration_sources(calib_data: str | None) -> list[str | None]:
    """The sources `calib_data` names, None for the built-in corpus: comma-separated
    ones mix (a file whose own name holds a comma is one source)."""
    if calib_data is None:
        return [None]
    if Path(calib_data).is_file():
        return [calib_data]
    parts = [part.strip() for part in calib_data.split(",")]
    if not all(parts):
        raise UsageError(f"calib_data={calib_data!r} has an empty source between its commas")
    return [None if part == BUILTIN else part for part in parts]
