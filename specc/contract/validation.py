"""Checks a method's `validate` runs before any work: paths named by config fields."""

from __future__ import annotations

from pathlib import Path

from specc.data.calibration import calibration_sources
from specc.data.prompts import PROMPT_SET_NAMES
from specc.errors import UsageError


def check_data_file(value: str | None, field: str = "calib_data") -> None:
    """`value` (a --set FIELD=VALUE) must be a prompt-set name or an existing file."""
    if value is None or value in PROMPT_SET_NAMES:
        return
    path = Path(value)
    if path.is_dir():
        raise UsageError(f"--set {field}={value} is a directory; pass a JSONL or text file")
    if not path.is_file():
        raise UsageError(f"--set {field}={value}: no such file; pass a JSONL or text file, or a prompt set "
                         f"name ({', '.join(PROMPT_SET_NAMES)})")


def check_calibration_data(value: str | None, field: str = "calib_data") -> None:
    """Training text for `specc.train.corpus.token_windows`: each of its comma-separated
    sources is `builtin`, a prompt-set name or an existing file."""
    for source in calibration_sources(value):
        check_data_file(source, field)


def check_lookup_corpus(value: str) -> None:
    """Text for `specc.data.token_corpus.corpus_token_sequences`: every comma-separated source
    exists, and none is the built-in corpus (not text the target wrote). Empty: no corpus."""
    from specc.data.token_corpus import NOT_BUILTIN

    if not value:
        return
    if None in calibration_sources(value):
        raise UsageError(NOT_BUILTIN)
    check_calibration_data(value, "lookup_corpus")
