"""Typed, versioned method configs that round-trip through JSON.

A config is a frozen dataclass; each field's metadata carries its help
text. Unknown keys and values of the wrong type are rejected with a
message that names the field, the bad value and what is allowed.

Fields several methods share (the distillation loop's settings, the
calibration text) come from option blocks (`specc/contract/options.py`):
frozen dataclass mixins, subclasses of `OptionBlock`, that a config
inherits. A config redeclares a block field to give it its own default or
help; `option(default)` without help keeps the block's help text. Listings
(`describe_fields`, `to_json`) put the config's own fields first, then each
block's fields in the block's order.

A config class carries a `VERSION` (a class attribute, 1 unless the class
says otherwise) that `to_json` writes under the key `version`, so an
engine's manifest records which version of its method's config it was
compiled with. Bump it when an existing field's meaning changes (its unit,
its range, what a value does) or a field is renamed or removed; adding a
field whose default keeps the old behaviour needs no bump. `from_json`
reads a mapping without `version` as version 1 (manifests written before
configs were versioned); a different version is read through the class's
`upgrade` hook, and refused with a `ConfigVersionError` when it returns None
(the default).
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, replace
from typing import Any, ClassVar, get_type_hints

from specc.contract.bounds import Bounds
from specc.errors import UsageError

VERSION_KEY = "version"      # the key `to_json` writes the config's VERSION under; no field may take it
UNVERSIONED = 1              # the version of a config mapping that records none (written before versions)


def option(default, help: str | None = None, *, at_load: bool | None = None, **kwargs):
    """A config field with its help text (shown by `specc methods`) and the values it allows
    (`at_least`, `at_most`, `above`, `below`, `choices`: `specc.contract.bounds`). `at_load`:
    the field changes no graph, weight or compiled data, only how the runtime drafts, so
    `specc run/bench/chat/serve --set` may change it when an engine loads. Without `help`,
    bounds or `at_load`, a field that redeclares an option block's field (to change its
    default) keeps the block's."""
    metadata = {"help": help, **kwargs} if help is not None else dict(kwargs)
    if at_load is not None:
        metadata["at_load"] = at_load
    return field(default=default, metadata=metadata)


def require(ok: bool, message: str) -> None:
    """A rule between a config's fields (one field's range or choices go in its `option(...)`):
    a `UsageError` with `message` when it fails."""
    if not ok:
        raise UsageError(message)


class ConfigVersionError(UsageError):
    """A config mapping written by a version of its config class this specc cannot read."""

    def __init__(self, config_class: type, found: int, expected: int, recorded: bool = True):
        self.config_class, self.found, self.expected, self.recorded = config_class, found, expected, recorded
        age = "newer" if found > expected else "older"
        written = f"version {found}" if recorded else f"no version (read as version {found})"
        super().__init__(f"{config_class.__name__} settings record {written}, {age} than the version this "
                         f"specc reads ({expected})")

    def __reduce__(self):
        return type(self), (self.config_class, self.found, self.expected, self.recorded)


@dataclass(frozen=True)
class OptionBlock:
    """Base of the option blocks: frozen dataclass mixins holding fields several methods share.

    A block may check its fields in `__post_init__`; it calls `super().__post_init__()` last, so
    every block a config inherits checks its own. A config that defines `__post_init__` calls
    `super().__post_init__()` too (after its own checks, which therefore win for a field both check).
    """

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()


@dataclass(frozen=True)
class MethodConfig:
    """Base class: subclasses add fields with `option(...)` and inherit option blocks."""

    VERSION: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if VERSION_KEY in vars(cls).get("__annotations__", {}):
            raise TypeError(f"{cls.__name__} declares a field {VERSION_KEY!r}; that key holds the config's "
                            f"VERSION in JSON: name the field otherwise (and set VERSION = N for the version)")
        if not isinstance(cls.VERSION, int) or isinstance(cls.VERSION, bool) or cls.VERSION < 1:
            raise TypeError(f"{cls.__name__}.VERSION must be a positive integer, got {cls.VERSION!r}")

    def __post_init__(self):
        """Every field within the bounds it declares (`specc.contract.bounds`), then the option
        blocks' own checks. A config's `__post_init__` calls this first, then relates fields."""
        for f in fields(self):
            bounds = type(self).field_bounds(f.name)
            if bounds is not None:
                bounds.check(f.name, getattr(self, f.name))
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()

    def to_json(self) -> dict:
        """`{"version": VERSION, field: value, ...}`, fields in `describe_fields` order."""
        data = {f.name: copy.deepcopy(getattr(self, f.name)) for f in self.ordered_fields()}
        return {VERSION_KEY: self.VERSION, **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MethodConfig":
        """The config `to_json` wrote: fields by name, missing ones at their defaults. A mapping
        without `version` is version 1; another version than `VERSION` goes through `upgrade`."""
        data = dict(data)
        recorded = VERSION_KEY in data
        version = data.pop(VERSION_KEY) if recorded else UNVERSIONED
        if not isinstance(version, int) or isinstance(version, bool):
            raise UsageError(f"config {VERSION_KEY} must be an integer, got {version!r}")
        if version != cls.VERSION:
            upgraded = cls.upgrade(data, version) if version < cls.VERSION else None
            if upgraded is None:
                raise ConfigVersionError(cls, version, cls.VERSION, recorded)
            data = upgraded
        return cls._from_fields(data)

    @classmethod
    def upgrade(cls, data: dict[str, Any], version: int) -> dict[str, Any] | None:
        """Fields written by an older `version` of this config, rewritten as this VERSION's
        fields; None when they cannot be carried over (the engine has to be recompiled).
        The default carries nothing over: override it when bumping VERSION if old engines
        should keep loading."""
        return None

    @classmethod
    def from_assignments(cls, assignments: list[str]) -> "MethodConfig":
        """Parse `key=value` strings from the command line."""
        return cls._from_fields(parse_assignments(assignments))

    def with_assignments(self, assignments: list[str]) -> "MethodConfig":
        """This config with the fields `key=value` strings from the command line set (checked as
        `from_assignments` checks them)."""
        return replace(self, **self._typed_fields(parse_assignments(assignments)))

    @classmethod
    def _from_fields(cls, data: dict[str, Any]) -> "MethodConfig":
        return cls(**cls._typed_fields(data))

    @classmethod
    def _typed_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(
                f"unknown config field(s) {', '.join(unknown)} for this method; "
                f"known fields: {', '.join(sorted(known)) or '(none)'}"
            )
        hints = get_type_hints(cls)
        return {k: _coerce(cls, k, v, hints[k]) for k, v in data.items()}

    @classmethod
    def ordered_fields(cls) -> list[Field]:
        """The dataclass fields, the config's own first, then each option block's (in the order
        the blocks come in the class's bases, each block's fields in its own order); a field
        the config redeclares stays in its block's place."""
        blocks = [klass for klass in cls.__mro__
                  if isinstance(klass, type) and issubclass(klass, OptionBlock) and klass is not OptionBlock
                  and not issubclass(klass, MethodConfig) and is_dataclass(klass)]
        block_names: list[str] = []
        for block in blocks:
            block_names += [f.name for f in fields(block) if f.name not in block_names]
        by_name = {f.name: f for f in fields(cls)}
        own = [f for f in by_name.values() if f.name not in block_names]
        return own + [by_name[name] for name in block_names if name in by_name]

    @classmethod
    def _declarations(cls, name: str):
        """Field `name` as each class declares it, the config's own first, then its bases' (the
        option blocks') in MRO order: a field redeclared without help, bounds or `at_load`
        takes them from the nearest declaration that has them."""
        for klass in cls.__mro__:
            declared = vars(klass).get("__dataclass_fields__", {}).get(name)
            if declared is not None:
                yield declared

    @classmethod
    def field_help(cls, name: str) -> str:
        """The help of field `name`: its own, else the nearest base's (the option block's)."""
        return next((d.metadata["help"] for d in cls._declarations(name) if d.metadata.get("help")), "")

    @classmethod
    def load_time_fields(cls) -> tuple[str, ...]:
        """The fields an engine may change when it loads (`option(..., at_load=True)`; a field
        that redeclares a block's keeps the block's choice unless it states its own)."""
        def at_load(name: str) -> bool:
            return next((d.metadata["at_load"] for d in cls._declarations(name) if "at_load" in d.metadata), False)
        return tuple(f.name for f in cls.ordered_fields() if at_load(f.name))

    @classmethod
    def field_bounds(cls, name: str) -> Bounds | None:
        """The bounds of field `name`: its own declaration's, else the nearest base's."""
        declared = (Bounds.from_metadata(d.metadata) for d in cls._declarations(name))
        return next((bounds for bounds in declared if bounds is not None), None)

    @classmethod
    def describe_fields(cls) -> list[dict]:
        """Each field's name, type, default, help, allowed values (None: any of its type) and
        whether an engine may change it when it loads."""
        hints = get_type_hints(cls)
        at_load = set(cls.load_time_fields())
        described = []
        for f in cls.ordered_fields():
            bounds = cls.field_bounds(f.name)
            described.append({"name": f.name, "type": _type_name(hints[f.name]),
                              "default": f.default if f.default is not MISSING else None,
                              "help": cls.field_help(f.name), "allowed": bounds.describe() if bounds else None,
                              "at_load": f.name in at_load})
        return described


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """`key=value` strings from the command line as {field name: value text}."""
    data = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"malformed config setting {item!r}; write it as key=value")
        data[key.strip().replace("-", "_")] = value.strip()
    return data


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
