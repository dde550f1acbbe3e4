"""The pass contract: a typed config, a verb-named callable, a result that
says whether and how the graph changed.

Every pass leaves the graph valid (linted, dead code removed, recompiled)
and is idempotent: running it on its own output changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx


@dataclass
class PassResult:
    graph_module: fx.GraphModule
    modified: bool
    inserted: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    added_parameters: list[str] = field(default_factory=list)
    added_inputs: list[str] = field(default_factory=list)

    @classmethod
    def unchanged(cls, gm: fx.GraphModule) -> "PassResult":
        return cls(gm, modified=False)


class GraphPass:
    """Base for passes: subclasses set `name` and implement `run`."""

    name: str = ""

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        return self.run(gm)

    def run(self, gm: fx.GraphModule) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> dict:
        """The config as JSON-ready data, recorded in the engine manifest."""
        config = getattr(self, "config", None)
        return config.to_json() if config is not None else {}


def new_nodes(before: set[fx.Node], gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n not in before]
