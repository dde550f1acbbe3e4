"""Run passes in order, record what each did, and name the one that failed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.signature import declarations, keep_declarations, read_signature
from specc.passes.base import GraphPass


@dataclass
class PassRecord:
    """What one pass did to one named graph: the data `specc inspect` shows."""

    pass_name: str
    graph: str
    config: dict
    modified: bool
    inserted: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    added_parameters: list[str] = field(default_factory=list)
    added_inputs: list[str] = field(default_factory=list)
    seconds: float = 0.0
    graph_text: str = ""

    def to_json(self) -> dict:
        data = dict(self.__dict__)
        data.pop("graph_text")
        return data

    @classmethod
    def from_json(cls, data: dict) -> "PassRecord":
        return cls(**data)


def run_passes(graph_name: str, gm: fx.GraphModule, passes: list[GraphPass]) -> tuple[fx.GraphModule, list[PassRecord]]:
    records: list[PassRecord] = []
    for graph_pass in passes:
        start = time.perf_counter()
        before = declarations(gm)
        try:
            result = graph_pass(gm)
            keep_declarations(before, result.graph_module)
            read_signature(result.graph_module)
            result.graph_module.graph.lint()
        except SpeccError as exc:
            raise SpeccError(f"pass {graph_pass.name} failed on graph {graph_name!r}{_after(records)}: {exc}") from exc
        except Exception as exc:
            raise SpeccError(
                f"pass {graph_pass.name} failed on graph {graph_name!r}{_after(records)}: {type(exc).__name__}: {exc}"
            ) from exc
        gm = result.graph_module
        records.append(PassRecord(
            pass_name=graph_pass.name, graph=graph_name, config=graph_pass.describe(), modified=result.modified,
            inserted=result.inserted, replaced=result.replaced, added_parameters=result.added_parameters,
            added_inputs=result.added_inputs, seconds=round(time.perf_counter() - start, 4),
            graph_text=readable_graph(gm),
        ))
    return gm, records


def _after(records: list[PassRecord]) -> str:
    return f" (after {records[-1].pass_name})" if records else " (first pass)"


def readable_graph(gm: fx.GraphModule) -> str:
    """The graph as Python-like code, including any segment submodules."""
    parts = [gm.code.strip()]
    for name, child in gm.named_children():
        if isinstance(child, fx.GraphModule):
            parts.append(f"# --- submodule {name} ---\n{child.code.strip()}")
    return "\n\n".join(parts) + "\n"
