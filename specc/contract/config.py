"""Typed, versioned method configs that round-trip through JSON.

A config is a frozen dataclass; each field's metadata carries its help
text. Unknown keys and values of the wrong type are rejected with a
message that names the field, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from specc.errors import UsageError


def option(default, help: str, **kwargs):
    """A config field with its help text (shown by `specc methods`)."""
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass(frozen=True)
class MethodConfig:
    """Base class: subclasses add fields with `option(...)`."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MethodConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(
                f"unknown config field(s) {', '.join(unknown)} for this method; "
                f"known fields: {', '.join(sorted(known)) or '(none)'}"
            )
        hints = get_type_hints(cls)
        return cls(**{k: _coerce(cls, k, v, hints[k]) for k, v in data.items()})

    @classmethod
    def from_assignments(cls, assignments: list[str]) -> "MethodConfig":
        """Parse `key=value` strings from the command line."""
        data = {}
        for item in assignments:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise UsageError(f"malformed config setting {item!r}; write it as key=value")
            data[key.strip().replace("-", "_")] = value.strip()
        return cls.from_json(data)

    @classmethod
    def describe_fields(cls) -> list[dict]:
        hints = get_type_hints(cls)
        return [
            {"name": f.name, "type": _type_name(hints[f.name]), "default": f.default,
             "help": f.metadata.get("help", "")}
            for f in fields(cls)
        ]


def _type_name(hint) -> str:
    return getattr(hint, "__name__", str(hint)).replace("typing.", "")


def _coerce(cls, name: str, value, hint):
    if hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes", "on"):
            return True
        if str(value).lower() in ("false", "0", "no", "off"):
            return False
        raise UsageError(f"config field {name} must be true or false, got {value!r}")
    for kind in (int, float):
        if hint is kind:
            try:
                return kind(value)
            except (TypeError, ValueError):
                raise UsageError(f"config field {name} must be {kind.__name__}, got {value!r}") from None
    if hint is str or hint == (str | None):
        return None if value is None else str(value)
    if getattr(hint, "__origin__", None) is tuple or str(hint).startswith("tuple"):
        items = value.split(",") if isinstance(value, str) else list(value)
        kind = next(iter(getattr(hint, "__args__", ())), int)
        kind = kind if kind in (int, float) else int
        try:
            return tuple(kind(v) for v in items)
        except ValueError:
            noun = "integers" if kind is int else "numbers"
            raise UsageError(f"config field {name} must be a comma-separated list of {noun}, got {value!r}") from None
    return value
