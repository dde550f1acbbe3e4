"""The backends specc can lower to, found by name.

Built-in backends are modules of this package; other packages add theirs
through the `specc.backends` entry-point group (each entry point names a
`Backend` instance). Names are listed without importing any backend, so
the command line stays light.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from specc.errors import UsageError

ENTRY_POINT_GROUP = "specc.backends"
_BUILTIN = {"eager": "specc.lower.eager", "inductor": "specc.lower.inductor", "aoti": "specc.lower.aoti",
            "onnx": "specc.lower.onnx", "tensorrt": "specc.lower.tensorrt"}
_LOADED: dict = {}


def backend_names() -> list[str]:
    return [*_BUILTIN, *(e.name for e in _entry_points() if e.name not in _BUILTIN)]


def get_backend(name: str):
    """The registered `specc.lower.backend.Backend` called `name`."""
    if name not in _LOADED:
        if name in _BUILTIN:
            backend = importlib.import_module(_BUILTIN[name]).BACKEND
        else:
            entry = next((e for e in _entry_points() if e.name == name), None)
            if entry is None:
                raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(backend_names())}")
            backend = entry.load()
        if backend.name != name:
            raise UsageError(f"backend registered as {name!r} calls itself {backend.name!r}")
        _LOADED[name] = backend
    return _LOADED[name]


def _entry_points():
    return entry_points(group=ENTRY_POINT_GROUP)
