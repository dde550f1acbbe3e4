"""A method is a descriptor: name, config class, ordered passes per graph,
an optional training step, and a runtime policy that builds its drafter.

Adding a method means writing one module that calls `register(...)`; the
compiler, engine format, runtime loop and CLI never change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from specc.errors import UsageError
from specc.methods.config import MethodConfig

if TYPE_CHECKING:
    from specc.engine.loaded import LoadedEngine
    from specc.passes.base import GraphPass
    from specc.program import SpeculativeProgram
    from specc.runtime.drafter import Drafter


@dataclass(frozen=True)
class GraphRecipe:
    """One named graph of the speculative program: which model it is
    captured from ("target" or "draft") and the passes that rewrite it."""

    source: str
    passes: Callable[[MethodConfig], list["GraphPass"]]


@dataclass(frozen=True)
class MethodDescriptor:
    name: str
    summary: str
    config_class: type[MethodConfig]
    graphs: Callable[[MethodConfig], dict[str, GraphRecipe]]
    make_drafter: Callable[["LoadedEngine", MethodConfig], "Drafter | None"]
    lossless: bool = True
    needs_draft_model: bool = False
    backends: tuple[str, ...] = ("eager", "inductor", "aoti")
    # train(program, config, tokenizer) -> trained weights by name, plus optionally a
    # JSON-ready "method_state" entry (e.g. a searched skip set) stored in the manifest.
    train: Callable[["SpeculativeProgram", MethodConfig, object], dict] | None = None


_REGISTRY: dict[str, MethodDescriptor] = {}


def register(descriptor: MethodDescriptor) -> MethodDescriptor:
    if descriptor.name in _REGISTRY:
        raise ValueError(f"method {descriptor.name!r} is registered twice")
    _REGISTRY[descriptor.name] = descriptor
    return descriptor


def get_method(name: str) -> MethodDescriptor:
    _load_builtin_methods()
    if name not in _REGISTRY:
        raise UsageError(f"unknown method {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def all_methods() -> list[MethodDescriptor]:
    _load_builtin_methods()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def _load_builtin_methods() -> None:
    from specc.methods import builtin  # noqa: F401  (registers on import)
