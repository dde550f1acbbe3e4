"""What a graph takes and gives: each input and output declared with a role,
a dtype and a shape whose dimensions are integers or named symbols.

Passes declare what they add (`declare_input`, `declare_outputs`) in node
metadata; `read_signature` collects it, the manifest stores it, and every
backend's example inputs and every warm-up are built from it alone
(`example_inputs`), so no loader or backend names a method's inputs.

Dimension symbols: `q` (query rows), `kv` (attended slots) and `r` (rows
whose logits a call asks for, `specc.passes.select_logit_rows`) are dynamic;
every other symbol is static and resolved by `static_sizes` from the
architecture and the engine's max sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import output_node

INPUT_META = "specc_io"
OUTPUTS_META = "specc_outputs"
LOGIT_ROWS_DIM = "r"
DYNAMIC_DIMS = ("q", "kv", LOGIT_ROWS_DIM)
# Roles the runtime reads besides the decoding ones: a graph's logits, and the rows whose
# logits a call asks for (`specc.passes.select_logit_rows`).
LOGITS_ROLE = "logits"
CACHE_ROLE = "kv_cache"   # an input holding one layer's K or V cache, written in place
LOGIT_ROWS_ROLE = "logit_rows"
DTYPES = ("int64", "bool", "float")   # "float": the engine's floating dtype

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    name: str
    role: str
    dtype: str
    shape: tuple[Dim, ...]

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise SpeccError(f"tensor {self.name!r}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")

    def to_json(self) -> dict:
        return {"name": self.name, "role": self.role, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: dict) -> "TensorSpec":
        return cls(data["name"], data["role"], data["dtype"], tuple(data["shape"]))

    def torch_dtype(self, float_dtype: torch.dtype) -> torch.dtype:
        return {"int64": torch.long, "bool": torch.bool}.get(self.dtype, float_dtype)


@dataclass(frozen=True)
class GraphSignature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]

    def inputs_with_role(self, role: str) -> list[TensorSpec]:
        return [spec for spec in self.inputs if spec.role == role]

    def to_json(self) -> dict:
        return {"inputs": [s.to_json() for s in self.inputs], "outputs": [s.to_json() for s in self.outputs]}

    @classmethod
    def from_json(cls, data: dict) -> "GraphSignature":
        return cls(tuple(map(TensorSpec.from_json, data["inputs"])),
                   tuple(map(TensorSpec.from_json, data["outputs"])))


def declare_input(node: fx.Node, role: str, dtype: str, shape: tuple[Dim, ...]) -> fx.Node:
    """Record what the placeholder `node` takes (its name is the input's name)."""
    node.meta[INPUT_META] = TensorSpec(str(node.target), role, dtype, tuple(shape)).to_json()
    return node


def declare_outputs(graph: fx.Graph, specs: list[TensorSpec]) -> None:
    """Record what each output of the graph is, in order."""
    output = output_node(graph)
    if _output_count(output) != len(specs):
        raise SpeccError(f"the graph has {_output_count(output)} outputs but {len(specs)} were declared")
    output.meta[OUTPUTS_META] = [spec.to_json() for spec in specs]


def declared_outputs(graph: fx.Graph) -> list[TensorSpec]:
    """The outputs declared so far (none before capture declares them)."""
    return [TensorSpec.from_json(spec) for spec in output_node(graph).meta.get(OUTPUTS_META, [])]


def append_outputs(graph: fx.Graph, values: list[fx.Node], specs: list[TensorSpec]) -> None:
    """Return `values` after the graph's current outputs, declared as `specs`."""
    output = output_node(graph)
    declared = declared_outputs(graph)
    current = output.args[0]
    current = tuple(current) if isinstance(current, (tuple, list)) else (current,)
    output.args = ((*current, *values),)
    declare_outputs(graph, declared + list(specs))


def read_signature(gm: fx.GraphModule) -> GraphSignature:
    """The declared signature; every input and output must have been declared."""
    inputs = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        if INPUT_META not in node.meta:
            raise SpeccError(f"graph input {node.target!r} was added without a declaration "
                             f"(a pass must call specc.graph.signature.declare_input)")
        inputs.append(TensorSpec.from_json(node.meta[INPUT_META]))
    output = output_node(gm.graph)
    if OUTPUTS_META not in output.meta:
        raise SpeccError("the graph's outputs were never declared (specc.graph.signature.declare_outputs)")
    return GraphSignature(tuple(inputs), tuple(map(TensorSpec.from_json, output.meta[OUTPUTS_META])))


def declarations(gm: fx.GraphModule) -> tuple[dict[str, dict], list | None]:
    """The graph's input declarations by name and its output declarations, taken
    before a pass that may rebuild the graph."""
    inputs = {str(n.target): n.meta[INPUT_META] for n in gm.graph.nodes
              if n.op == "placeholder" and INPUT_META in n.meta}
    return inputs, output_node(gm.graph).meta.get(OUTPUTS_META)


def keep_declarations(declared: tuple[dict[str, dict], list | None], gm: fx.GraphModule) -> None:
    """Re-attach declarations a rewrite dropped (e.g. a pass that rebuilt the
    graph around segments): inputs by name, outputs when their count is kept."""
    inputs, outputs = declared
    for node in gm.graph.nodes:
        if node.op == "placeholder" and INPUT_META not in node.meta and str(node.target) in inputs:
            node.meta[INPUT_META] = inputs[str(node.target)]
    output = output_node(gm.graph)
    if OUTPUTS_META not in output.meta and outputs is not None and _output_count(output) == len(outputs):
        output.meta[OUTPUTS_META] = outputs


def _output_count(output: fx.Node) -> int:
    values = output.args[0]
    return len(values) if isinstance(values, (tuple, list)) else 1


def static_sizes(architecture, max_seq_len: int) -> dict[str, int]:
    """Values of the static dimension symbols for one graph."""
    return {
        "slots": max_seq_len + 1,             # the KV cache keeps one spare slot (see KVCache)
        "hidden": architecture.hidden_size,
        "kv_heads": architecture.num_key_value_heads,
        "head_dim": architecture.head_dim,
        "vocab": architecture.vocab_size,
    }


def concrete_shape(spec: TensorSpec, sizes: dict[str, int]) -> tuple[int, ...]:
    try:
        return tuple(d if isinstance(d, int) else sizes[d] for d in spec.shape)
    except KeyError as missing:
        raise SpeccError(f"input {spec.name!r}: no size for dimension {missing} "
                         f"(known: {', '.join(sorted(sizes))})") from None


def example_inputs(signature: GraphSignature, sizes: dict[str, int], float_dtype: torch.dtype,
                   q: int = 3, kv: int = 5, device="cpu", r: int | None = None) -> list[torch.Tensor]:
    """Inputs of the declared shapes with `q` query rows over `kv` slots, logits asked
    for `r` rows (default: `q`): zeros (in range for every index input), masks all True."""
    sizes = {**sizes, "q": q, "kv": kv, "r": q if r is None else r}
    tensors = []
    for spec in signature.inputs:
        shape = concrete_shape(spec, sizes)
        dtype = spec.torch_dtype(float_dtype)
        make = torch.ones if dtype == torch.bool else torch.zeros
        tensors.append(make(shape, dtype=dtype, device=device))
    return tensors


def dynamic_dims(signature: GraphSignature, max_seq_len: int) -> list[dict | None]:
    """torch.export dynamic_shapes for the inputs: the `q`, `kv` and `r` axes."""
    dims = {name: torch.export.Dim(name, min=1, max=max_seq_len) for name in DYNAMIC_DIMS}
    result = []
    for spec in signature.inputs:
        axes = {axis: dims[d] for axis, d in enumerate(spec.shape) if d in dims}
        result.append(axes or None)
    return result
