"""A deterministic sampler of code prefixes from Python's standard library.

The fallback for the `code` prompt set while `specc.data.corpora` is
absent. Unlike the reference models' held-out split, these files may have
been seen in training, so acceptance measured on them can be optimistic.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from specc.errors import SpeccError

_DEFINITION_STARTS = ("def ", "class ", "    def ")
_GOLDEN_FRACTION = 0.6180339887498949


def stdlib_code_prompts(n: int, prompt_chars: int) -> list[str]:
    """`n` prefixes of about `prompt_chars` characters, each starting at a
    definition a third of the way into an evenly spread stdlib module."""
    files = _stdlib_modules()
    prompts = []
    for path in _spread(files):
        prefix = code_prefix(path.read_text(encoding="utf-8", errors="replace"), prompt_chars)
        if prefix:
            prompts.append(prefix)
        if len(prompts) == n:
            return prompts
    raise SpeccError(f"the standard library at {files[0].parent} yields only {len(prompts)} code prefixes "
                     f"of {prompt_chars} characters, fewer than the {n} asked for; ask for fewer prompts")


def code_prefix(source: str, prompt_chars: int) -> str | None:
    """From the first definition past a third of `source`, at most
    `prompt_chars` characters cut at a line end; None if too little is left."""
    lines = source.splitlines(keepends=True)
    start = next((i for i in range(len(lines) // 3, len(lines)) if lines[i].startswith(_DEFINITION_STARTS)), None)
    if start is None:
        return None
    text = "".join(lines[start:])[:prompt_chars]
    cut = text.rfind("\n")
    text = text[: cut + 1] if cut > 0 else text
    return text if len(text) >= prompt_chars // 2 else None


def _stdlib_modules() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith(("_", "test")))
    if not files:
        raise SpeccError(f"no standard-library modules found under {root}; pass a prompt file with --prompts FILE")
    return files


def _spread(items: list) -> list:
    """All of `items`, reordered so that any first k of them lie evenly spread
    (golden-ratio steps through the list)."""
    order, seen = [], set()
    for j in range(4 * len(items)):
        i = int((j * _GOLDEN_FRACTION) % 1.0 * len(items))
        if i not in seen:
            seen.add(i)
            order.append(items[i])
    return order + [item for i, item in enumerate(items) if i not in seen]
