"""Serialize FX graphs to JSON and back, without pickle.

Only aten/prims/specc operators and a short list of Python callables
(operator, math, torch.sym_*) can be named by a serialized graph, so
loading an engine can never run arbitrary code. Weights travel separately
as safetensors; a graph refers to them by `get_attr` target.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import ATTENTION_WINDOW, PADDED_ROWS, ROW_LOOKUPS, WINDOWED_MASK, attribute

FORMAT = "specc-fx-graph/1"
_OP_NAMESPACES = ("aten", "prims", "specc")
_PYTHON_MODULES = {"operator": operator, "math": math}


def graph_to_json(gm: fx.GraphModule) -> dict:
    """Nodes in order, plus any called GraphModule submodules (e.g. layer segments)."""
    submodules = {
        node.target: graph_to_json(gm.get_submodule(node.target))
        for node in gm.graph.nodes if node.op == "call_module"
    }
    return {"format": FORMAT, "nodes": [_node_to_json(n) for n in gm.graph.nodes], "submodules": submodules}


def graph_from_json(data: dict, attributes: dict[str, torch.Tensor], prefix: str = "") -> fx.GraphModule:
    """Rebuild a graph; `attributes` are keyed by their full dotted name from the root."""
    if data.get("format") != FORMAT:
        raise SpeccError(f"graph format {data.get('format')!r} is not {FORMAT!r}; recompile the engine")
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for spec in data["nodes"]:
        target = _decode_target(spec["op"], spec["target"])
        node = graph.create_node(
            spec["op"], target, _decode(spec["args"], env), _decode(spec["kwargs"], env), name=spec["name"]
        )
        node.meta.update(_decode_meta(spec.get("meta", {})))
        env[spec["name"]] = node
    root = _attribute_root(graph, attributes, prefix)
    for name, child in data.get("submodules", {}).items():
        if "." in name or not name.isidentifier():
            raise SpeccError(f"engine graph names submodule {name!r}; refusing to load it")
        root.add_module(name, graph_from_json(child, attributes, f"{prefix}{name}."))
    gm = fx.GraphModule(root, graph)
    gm.graph.lint()
    return gm


def attributes_streamed(data: dict, prefix: str = "") -> set[str]:
    """The attributes (by full dotted name) a serialized graph or its submodules read as a whole:
    every one some node takes as an argument, except a table only looked up (`ROW_LOOKUPS`), which
    a call reads a row at a time."""
    lookups = {op_name(op) for op in ROW_LOOKUPS}
    attributes = {spec["name"]: prefix + spec["target"] for spec in data["nodes"] if spec["op"] == "get_attr"}
    streamed = set()
    for spec in data["nodes"]:
        if spec["op"] == "get_attr":
            continue
        arguments = [spec["args"], spec["kwargs"]]
        if spec["target"] in lookups and spec["args"].get("tuple"):
            arguments = [spec["args"]["tuple"][1:], spec["kwargs"]]   # the table is the first argument
        streamed |= {attributes[name] for name in _referenced(arguments) if name in attributes}
    for name, child in data.get("submodules", {}).items():
        streamed |= attributes_streamed(child, f"{prefix}{name}.")
    return streamed


def _referenced(value) -> set[str]:
    """The node names an encoded argument refers to."""
    if isinstance(value, list):
        return set().union(*map(_referenced, value))
    if not isinstance(value, dict):
        return set()
    (kind, payload), = value.items()
    if kind == "node":
        return {payload}
    if kind in ("list", "tuple"):
        return _referenced(payload)
    if kind == "dict":
        return _referenced(list(payload.values()))
    return set()


def _node_to_json(node: fx.Node) -> dict:
    return {
        "name": node.name,
        "op": node.op,
        "target": _encode_target(node),
        "args": _encode(node.args),
        "kwargs": _encode(dict(node.kwargs)),
        "meta": _encode_meta(node.meta),
    }


def _encode_target(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        namespace = target.namespace
        if namespace not in _OP_NAMESPACES:
            raise SpeccError(f"node {node.name} calls {target}, outside the serializable namespaces {_OP_NAMESPACES}")
        return op_name(target)
    module = getattr(target, "__module__", None)
    name = getattr(target, "__name__", None)
    if module in ("_operator", "operator") and hasattr(operator, name):
        return f"operator.{name}"
    if module == "math" or (module == "torch" and name.startswith("sym_")):
        return f"{'math' if module == 'math' else 'torch'}.{name}"
    raise SpeccError(f"node {node.name} calls {target!r}, which an engine cannot name safely")


def op_name(op: torch._ops.OpOverload) -> str:
    """How an engine graph names the operator `op`."""
    return f"torch.ops.{op.namespace}.{op._opname}.{op._overloadname}"


def _decode_target(op: str, target: str):
    if op in ("placeholder", "output", "get_attr"):
        return target
    if op == "call_module":
        return target
    if op != "call_function":
        raise SpeccError(f"graph node kind {op!r} is not allowed in an engine graph")
    head, _, rest = target.partition(".")
    if head == "torch" and rest.startswith("ops."):
        _, _, namespace, opname, overload = target.split(".")
        if namespace not in _OP_NAMESPACES:
            raise SpeccError(f"engine graph names operator namespace {namespace!r}; refusing to load it")
        if namespace == "specc":
            import specc.kernels  # noqa: F401  (registers torch.ops.specc.*)
        return getattr(getattr(getattr(torch.ops, namespace), opname), overload)
    if head == "torch" and rest.startswith("sym_"):
        return getattr(torch, rest)
    if head in _PYTHON_MODULES and hasattr(_PYTHON_MODULES[head], rest):
        return getattr(_PYTHON_MODULES[head], rest)
    raise SpeccError(f"engine graph names callable {target!r}; refusing to load it")


def _encode(value):
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": {k: _encode(v) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    raise SpeccError(f"cannot serialize graph argument {value!r} of type {type(value).__name__}")


def _decode(value, env: dict[str, fx.Node]):
    if not isinstance(value, dict):
        return value
    (kind, payload), = value.items()
    if kind == "node":
        return env[payload]
    if kind in ("list", "tuple"):
        items = [_decode(v, env) for v in payload]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _decode(v, env) for k, v in payload.items()}
    if kind == "device":
        return torch.device(payload)
    if kind in ("dtype", "layout", "memory_format"):
        decoded = getattr(torch, payload, None)
        if decoded is None:
            raise SpeccError(f"unknown torch {kind} {payload!r} in engine graph")
        return decoded
    raise SpeccError(f"unknown encoded value kind {kind!r} in engine graph")


PERSISTED_META = ("specc_role", "specc_io", "specc_outputs", ATTENTION_WINDOW, WINDOWED_MASK, PADDED_ROWS)


def _encode_meta(meta: dict) -> dict:
    stack = meta.get("nn_module_stack") or {}
    encoded = {"nn_module_stack": [[key, path, str(kind)] for key, (path, kind) in stack.items()]}
    for key in PERSISTED_META:
        if key in meta:
            encoded[key] = meta[key]
    return encoded


def _decode_meta(meta: dict) -> dict:
    decoded = {"nn_module_stack": {key: (path, kind) for key, path, kind in meta.get("nn_module_stack", [])}}
    for key in PERSISTED_META:
        if key in meta:
            decoded[key] = meta[key]
    return decoded


def _attribute_root(graph: fx.Graph, attributes: dict[str, torch.Tensor], prefix: str) -> torch.nn.Module:
    root = torch.nn.Module()
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        name = prefix + node.target
        if name not in attributes:
            raise SpeccError(f"engine graph needs weight {name!r}, which the weights file lacks")
        _set_attr(root, node.target, attributes[name])
    return root


def _set_attr(root: torch.nn.Module, dotted: str, tensor: torch.Tensor) -> None:
    *parents, leaf = dotted.split(".")
    owner = root
    for part in parents:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    owner.register_buffer(leaf, tensor)


def graph_attributes(gm: fx.GraphModule, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor a graph (and its called submodules) reads through get_attr,
    by full dotted name from the root."""
    tensors = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            tensors[prefix + node.target] = attribute(gm, node.target)
        elif node.op == "call_module":
            tensors.update(graph_attributes(gm.get_submodule(node.target), f"{prefix}{node.target}."))
    return tensors

