"""A method is a descriptor: name, config class, ordered passes per graph, an
optional compile-time training/calibration step, and a runtime builder.

Methods are found by name: the built-in packages of `specc.methods`, and
any package that declares an entry point in the `specc.methods` group
naming a `MethodDescriptor` (so a method can live outside specc). The
compiler, engine, runtime loop and CLI never name a method.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Callable

import torch

from specc.contract.config import MethodConfig
from specc.contract.drafter import MethodRuntime
from specc.errors import UsageError

if TYPE_CHECKING:
    from specc.contract.program import SpeculativeProgram
    from specc.passes.base import GraphPass

ENTRY_POINT_GROUP = "specc.methods"
_BUILTIN = ("specc.methods.none", "specc.methods.draft_model", "specc.methods.swift",
            "specc.methods.kangaroo", "specc.methods.specee", "specc.methods.s3d",
            "specc.methods.firp", "specc.methods.eagle")
TARGET = "target"   # the source name of the checkpoint being compiled


# Method state key under which a method stores the speedup it predicted at compile time
# (S3D's eq. 12 selection); `specc bench` reports it beside the measurement.
COMPILE_TIME_PREDICTION = "compile_time_prediction"


@dataclass(frozen=True)
class GraphRecipe:
    """One named graph of the speculative program: which source model it is
    captured from (`TARGET` or an extra source), the passes that rewrite it, and
    the passes that depend on what compile-time training chose (`after_training`:
    config and method state -> passes, run after `passes` once training is done).
    `drafts_only`: the graph's outputs only propose tokens, never decide one the target
    has not verified (so `--quantize-draft` may pack its weights at fewer bits).
    `lowered`: False keeps the graph as its FX module in the engine, never lowered whole
    (a method that only calls its segments, with `lower_segment`)."""

    source: str
    passes: Callable[[MethodConfig], list["GraphPass"]]
    after_training: Callable[[MethodConfig, dict], list["GraphPass"]] | None = None
    drafts_only: bool = False
    lowered: bool = True


@dataclass(frozen=True)
class ExtraSource:
    """A second checkpoint a method compiles besides the target (e.g. a draft
    model): the graph source name, and the config field naming its directory."""

    name: str
    config_field: str
    same_vocabulary: bool = True


@dataclass
class TrainResult:
    """What a compile-time training or calibration step produced: trained
    parameters by name (stored in `weights/added.safetensors`, read by the
    graphs that own them) and JSON-ready state for the manifest. A step that
    chooses hyper-parameters from measurements returns the config it chose
    (the manifest records it and the runtime reads it). Training runs on
    programs of its own (`TrainingContext`) and returns only data; the
    engine's program is built afterwards from the returned config, with each
    recipe's `after_training` passes, and the weights installed in its dtype."""

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    config: MethodConfig | None = None


@dataclass(frozen=True)
class TrainingContext:
    """What a compile-time training or calibration step works on.

    `program` holds the method's graphs for the compile's config, built by
    `build_program` from the compile's models in the training dtype (float32
    where that multiplies faster than the engine's: `specc.train.dtype`) on
    the training device, with no `after_training` pass yet. A step that needs
    other graphs asks for them (`build`, `build_graphs`) instead of rewriting
    a graph itself, so every pass runs, recorded, inside `build_program`; the
    graphs share the captured weights. `engine_backend` and `engine_device`
    are what the engine will be lowered for, for steps that measure costs."""

    program: "SpeculativeProgram"
    method: "MethodDescriptor"
    # (recipes by graph name, config, method state or None) -> the program of those graphs
    builder: Callable[[dict[str, GraphRecipe], MethodConfig, dict | None], "SpeculativeProgram"]
    engine_backend: str = "eager"
    engine_device: torch.device = torch.device("cpu")

    def build(self, config: MethodConfig, state: dict | None = None,
              names: tuple[str, ...] | None = None) -> "SpeculativeProgram":
        """The method's graphs (those in `names`, default all) for `config`; given `state`,
        with each recipe's `after_training` passes too, as the engine's program will be."""
        recipes = self.method.graphs(config)
        return self.builder({name: recipes[name] for name in names or recipes}, config, state)

    def build_graphs(self, recipes: dict[str, GraphRecipe], config: MethodConfig) -> "SpeculativeProgram":
        """Graphs that only training runs (e.g. a cut a student trains through), from `recipes`."""
        return self.builder(recipes, config, None)


@dataclass(frozen=True)
class MethodDescriptor:
    name: str
    summary: str
    config_class: type[MethodConfig]
    graphs: Callable[[MethodConfig], dict[str, GraphRecipe]]
    # (the engine's graphs as a `specc.runtime.context.MethodContext`, which builds the runtime's
    # cached models and so lives beside them, config) -> the target and drafter the loop runs.
    build_runtime: Callable[[Any, MethodConfig], MethodRuntime]
    lossless: bool = True
    # When losslessness depends on the config (a lossy paper mode beside a lossless one): config -> bool.
    lossless_when: Callable[[MethodConfig], bool] | None = None
    # config -> rows each verifying call holds per draft node (None: 1, the draft's rows only). FIRP's
    # pseudo rows ride along, k per node. Where a backend computes only so many rows exactly
    # (bfloat16, `Backend.exact_rows`), drafts are capped at exact rows // this many nodes, and an
    # engine that could then draft no token is compiled lossy (`specc.runtime.exactness`).
    call_rows_per_node: Callable[[MethodConfig], int] | None = None
    extra_sources: tuple[ExtraSource, ...] = ()
    requires: frozenset[str] = frozenset()      # backend capabilities (specc.lower.backend)
    # (training context, config, tokenizer) -> what training produced; it never touches the engine's program.
    train: Callable[[TrainingContext, MethodConfig, object], TrainResult] | None = None
    # (config, tokenizer) -> method state computed at compile time without the model (a tokenized
    # text corpus, say), kept in the engine beside training's state (`MethodContext.state`).
    prepare: Callable[[MethodConfig, object], dict] | None = None
    # γ, the most tokens a round drafts, for the benchmark's S3D eq. 12 prediction (None: no fixed depth).
    draft_depth: Callable[[MethodConfig], int] | None = None
    # Whether `train` runs on whatever device the program's graphs are on (it puts its inputs there).
    # False: on a GPU compile it trains on the CPU, and only the engine's graphs go to the device.
    trains_on_device: bool = False
    # Checks the config against the checkpoint's Hugging Face config (transformers.PretrainedConfig,
    # read from config.json before any weights load); raises UsageError naming the bad --set value.
    validate: Callable[[MethodConfig, object], None] | None = None
    # The checkpoint's Hugging Face config -> field values that replace the declared defaults for
    # this model (training lengths scaled to its size: `specc.train.model_size`); fields the user
    # sets keep the user's values.
    sized_defaults: Callable[[object], dict[str, Any]] | None = None


def check_backend(method: MethodDescriptor, backend) -> None:
    """The method's required capabilities must all be the backend's."""
    missing = sorted(method.requires - backend.capabilities)
    if missing:
        raise UsageError(f"method {method.name!r} needs {', '.join(missing)}, which backend {backend.name!r} "
                         f"does not provide; choose another backend")


_REGISTRY: dict[str, MethodDescriptor] = {}
_discovered = False


def register(descriptor: MethodDescriptor) -> MethodDescriptor:
    known = _REGISTRY.get(descriptor.name)
    if known is not None and known is not descriptor:
        raise ValueError(f"method {descriptor.name!r} is registered twice")
    _REGISTRY[descriptor.name] = descriptor
    return descriptor


def get_method(name: str) -> MethodDescriptor:
    _discover()
    if name not in _REGISTRY:
        raise UsageError(f"unknown method {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def all_methods() -> list[MethodDescriptor]:
    _discover()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for module in _BUILTIN:
        register(importlib.import_module(module).METHOD)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            descriptor = entry.load()
        except Exception as exc:
            raise UsageError(f"method entry point {entry.name!r} ({entry.value}) failed to load: "
                             f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(descriptor, MethodDescriptor):
            raise UsageError(f"method entry point {entry.name!r} ({entry.value}) is not a MethodDescriptor")
        register(descriptor)
