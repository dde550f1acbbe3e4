"""Make a graph's KV-cache writes visible to ONNX: written rows become outputs.

A specc graph writes each layer's new keys/values into its cache input in
place (`index_put_`, see `insert_kv_cache`). ONNX has no in-place writes:
exported, the write is a functional scatter whose result only feeds the
attention, and the caller's cache never changes. `expose_cache_writes`
rewrites a copy of the graph so that each write is functional (a
`scatter` along the slot axis) and the rows it writes are extra outputs, after the graph's
own; the caller then writes them into its caches at the cache slots
(`write_rows_into_caches`), touching only q rows per cache, as the graph did.

The copy is flat (submodules inlined, as export would inline them) and
shares the original's parameters; the original is never changed.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import output_node
from specc.graph.signature import CACHE_ROLE, GraphSignature

aten = torch.ops.aten
SLOTS_ROLE = "cache_slots"


@dataclass(frozen=True)
class CacheRows:
    """An extra output: the rows a graph writes into one cache input."""

    output_name: str
    cache_input: int   # position of the cache among the graph's inputs


@dataclass
class CacheWriteGraph:
    """The rewritten copy, how many outputs the original had and whether it
    returned them as a sequence, and the cache-row outputs that follow them."""

    module: fx.GraphModule
    original_outputs: int
    returns_sequence: bool
    cache_rows: list[CacheRows]


def expose_cache_writes(gm: fx.GraphModule, signature: GraphSignature) -> CacheWriteGraph:
    flat = inline_submodules(gm)
    placeholders = [n for n in flat.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(signature.inputs):
        raise SpeccError(f"the graph has {len(placeholders)} inputs but its signature declares "
                         f"{len(signature.inputs)}")
    slots = [p for p, spec in zip(placeholders, signature.inputs) if spec.role == SLOTS_ROLE]
    rows = []
    for index, (node, spec) in enumerate(zip(placeholders, signature.inputs)):
        if spec.role == CACHE_ROLE:
            write = _only_write(node, slots)
            if write is not None:
                write.target = aten.index_put.default
                _write_into_read_window(flat.graph, write)
                rows.append((CacheRows(f"{spec.name}_rows", index), write.args[2]))
                _scatter_along_slots(flat.graph, write)
    output = output_node(flat.graph)
    originals = output.args[0]
    returns_sequence = isinstance(originals, (tuple, list))
    originals = tuple(originals) if returns_sequence else (originals,)
    output.args = (originals + tuple(value for _, value in rows),)
    flat.graph.lint()
    flat.recompile()
    return CacheWriteGraph(flat, len(originals), returns_sequence, [r for r, _ in rows])


def _only_write(cache: fx.Node, slots: list[fx.Node]) -> fx.Node | None:
    """The one in-place write of `cache` at the cache slots, or None if the graph
    never writes it; anything else would be lost or misplaced in ONNX."""
    writes = [u for u in cache.users if u.target == aten.index_put_.default]
    others = [u.name for u in cache.users if u.target != aten.index_put_.default]
    if not writes:
        return None
    if len(writes) > 1 or others:
        raise SpeccError(f"cache input {cache.target!r} is written {len(writes)} times and read by "
                         f"{others or 'nothing else'}; the ONNX export supports one write per cache, "
                         f"read only through the write's result")
    write = writes[0]
    if write.args[0] is not cache or len(write.args) > 3 and write.args[3]:
        raise SpeccError(f"{write.name}: only a plain overwrite of cache {cache.target!r} can be exported")
    indices = write.args[1]
    if len(indices) != 3 or indices[:2] != [None, None] or indices[2] not in slots:
        raise SpeccError(f"{write.name} writes cache {cache.target!r} at {indices}; the ONNX export "
                         f"supports writes along the slot axis at the cache-slots input only")
    return write


def _write_into_read_window(graph: fx.Graph, write: fx.Node) -> None:
    """When the write's result is only read as the window `cache[:, :, :kv]`, write into
    that window instead: the functional write then copies kv rows, not the whole cache.
    Every slot written is inside the window (each query row attends to its own slot);
    one that is not fails the run (out-of-bounds scatter) rather than being dropped."""
    windows = {(u.target, tuple(u.args[1:])) for u in write.users}
    if len(windows) != 1:
        return
    target, bounds = windows.pop()
    if target != aten.slice.Tensor or len(bounds) != 3 or bounds[:2] != (2, 0):
        return
    first_read = write.next
    while first_read not in write.users:
        first_read = first_read.next
    with graph.inserting_before(first_read):   # after the window's bounds are computed
        window = graph.call_function(aten.slice.Tensor, (write.args[0], *bounds))
    first_read.prepend(write)
    for read in list(write.users):
        read.replace_all_uses_with(write)
        graph.erase_node(read)
    write.args = (window, *write.args[1:])


def _scatter_along_slots(graph: fx.Graph, write: fx.Node) -> None:
    """Replace `index_put(window, [None, None, slots], rows)` by the same write as
    `scatter(window, 2, slots broadcast to rows, rows)`. ONNX exports the first as a
    ScatterND with the slot axis transposed to the front and back again (three extra
    copies of the window per cache per step), the second as one ScatterElements."""
    window, indices, rows = write.args[:3]
    with graph.inserting_before(write):
        index = graph.call_function(aten.view.default, (indices[2], [1, 1, -1, 1]))
        index = graph.call_function(aten.expand_as.default, (index, rows))
        scatter = graph.call_function(aten.scatter.src, (window, 2, index, rows))
    write.replace_all_uses_with(scatter)
    graph.erase_node(write)


def write_rows_into_caches(caches: list[torch.Tensor], rows: list[torch.Tensor], slots: torch.Tensor) -> None:
    for cache, written in zip(caches, rows):
        cache.index_copy_(2, slots, written)


def inline_submodules(gm: fx.GraphModule) -> fx.GraphModule:
    """A flat copy of `gm`: every `call_module` replaced by the submodule's nodes."""
    graph = fx.Graph()
    result = _copy_graph(gm, gm.graph, graph, inputs=None, prefix="")
    graph.output(result)
    return fx.GraphModule(gm, graph)


def _copy_graph(root: fx.GraphModule, source: fx.Graph, graph: fx.Graph, inputs, prefix: str):
    """Copy `source`'s nodes into `graph`; return what its output node returns.
    `inputs`: values for a submodule's placeholders (None: copy them as graph inputs)."""
    env: dict[fx.Node, object] = {}
    fed = iter(inputs) if inputs is not None else None
    for node in source.nodes:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node) if fed is None else next(fed)
        elif node.op == "output":
            return fx.node.map_arg(node.args[0], env.__getitem__)
        elif node.op == "call_module":
            submodule = root.get_submodule(prefix + str(node.target))
            args = fx.node.map_arg(node.args, env.__getitem__)
            env[node] = _copy_graph(root, submodule.graph, graph, args, f"{prefix}{node.target}.")
        elif node.op == "get_attr":
            env[node] = graph.get_attr(prefix + str(node.target))
            env[node].meta = dict(node.meta)
        elif node.target is operator.getitem and not isinstance(env[node.args[0]], fx.Node):
            env[node] = env[node.args[0]][node.args[1]]   # an inlined submodule's tuple output
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    raise SpeccError("graph has no output node")
