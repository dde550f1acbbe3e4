"""Run cached attention through specc's Triton kernel, `torch.ops.specc.tree_attention`.

Each masked scaled_dot_product_attention that reads the KV cache (the form
`insert_kv_cache` leaves: `sdpa(query, keys, values, attn_mask, scale=…,
enable_gqa=True)`) becomes `specc.tree_attention(query, keys, values,
attn_mask, scale, kv_len)`, the same computation. Segment submodules are
rewritten too, so the pass can run last, after passes that look for SDPA
nodes (`insert_skip_branches`) and after `segment_by_layer`.

`kv_len`, the live length the kernel stops at, is computed in the graph, on
the device: `amax(slots) + 1`, where `slots` are the cache positions the
layer's `index_put_` writes (every cached attention has them, segments
included). The graph has no other live-length scalar: the keys are a view as
wide as the mask, which the runtime pads (`runtime.masks.pad_keys`), and
position ids are tree depths, not slots. Every key a row may attend to (the
committed prefix, this call's rows) lies before the last slot written, so
masking from there on changes nothing; one `amax` per graph module serves
every layer that writes the same slots.

It is opt-in (`specc compile --kernels`): specc engines run on the CPU,
where the op computes its PyTorch reference (or interprets the Triton
kernel under `TRITON_INTERPRET=1`), so the kernel only pays off on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import attention_nodes, graph_modules
from specc.graph.patterns import is_cached_attention
from specc.graph.tidy import tidy
from specc.kernels import KERNELS
from specc.passes.base import GraphPass, PassResult

aten = torch.ops.aten
_REWRITTEN_KWARGS = {"scale", "enable_gqa"}   # dropout and is_causal are gone after insert_attention_mask


@dataclass(frozen=True)
class UseKernelsConfig:
    def to_json(self) -> dict:
        return {}


class UseKernels(GraphPass):
    name = "use_kernels"

    def __init__(self, config: UseKernelsConfig = UseKernelsConfig()):
        self.config = config

    def run(self, gm: fx.GraphModule) -> PassResult:
        replaced, inserted = [], []
        for module in graph_modules(gm):
            pending = attention_nodes(module.graph)
            if not pending:
                continue
            live_lengths: dict[fx.Node, fx.Node] = {}   # slots -> amax(slots) + 1, one per module
            for sdpa in pending:
                _check_rewritable(sdpa)
                replaced.append(sdpa.name)
                kv_len = _live_length(module.graph, sdpa, live_lengths)
                inserted.append(_swap_for_kernel(module.graph, sdpa, kv_len).name)
            tidy(module)
        if not replaced:
            return PassResult.unchanged(gm)
        return PassResult(gm, True, inserted=inserted, replaced=replaced)


def _check_rewritable(sdpa: fx.Node) -> None:
    if not is_cached_attention(sdpa):
        raise SpeccError(f"attention node {sdpa.name} does not read a KV cache; use_kernels runs after "
                         f"insert_kv_cache (put it after the infrastructure passes)")
    unexpected = sorted(set(sdpa.kwargs) - _REWRITTEN_KWARGS)
    if len(sdpa.args) != 4 or unexpected:
        raise SpeccError(f"attention node {sdpa.name} is not the masked form insert_kv_cache leaves "
                         f"(args {len(sdpa.args)}, expected query, keys, values, mask; unexpected keyword "
                         f"arguments {unexpected or 'none'}); tree_attention cannot replace it")


def _cache_slots(sdpa: fx.Node) -> fx.Node | None:
    """The slots the keys' `index_put_` writes (`insert_kv_cache`: `index_put_(cache,
    [None, None, slots], rows)` then `slice(…, 2, 0, kv)`), or None if written otherwise."""
    written = sdpa.args[1].args[0]
    indices = written.args[1] if len(written.args) > 1 else None
    if isinstance(indices, (list, tuple)) and len(indices) == 3 and isinstance(indices[2], fx.Node):
        return indices[2]
    return None


def _live_length(graph: fx.Graph, sdpa: fx.Node, known: dict[fx.Node, fx.Node]) -> fx.Node | None:
    slots = _cache_slots(sdpa)
    if slots is None:
        return None
    if slots not in known:
        with graph.inserting_before(sdpa):
            highest = graph.call_function(aten.amax.default, (slots, [0]))   # slots are [q]: a 0-d result
            known[slots] = graph.call_function(aten.add.Tensor, (highest, 1))
        if isinstance(slots.meta.get("val"), torch.Tensor):   # fake values, for passes that read them
            try:
                highest.meta["val"] = aten.amax.default(slots.meta["val"], [0])
                known[slots].meta["val"] = aten.add.Tensor(highest.meta["val"], 1)
            except Exception:   # noqa: BLE001 - metadata only: lowerings trace the graph again
                highest.meta.pop("val", None)
    return known[slots]


def _swap_for_kernel(graph: fx.Graph, sdpa: fx.Node, kv_len: fx.Node | None) -> fx.Node:
    query, keys, values, mask = sdpa.args
    with graph.inserting_before(sdpa):
        kernel = graph.call_function(KERNELS["tree_attention"].op, (query, keys, values, mask),
                                     {"scale": sdpa.kwargs.get("scale"), "kv_len": kv_len})
    kernel.meta.update(sdpa.meta)   # nn_module_stack (layer lookup) and the fake value, unchanged
    sdpa.replace_all_uses_with(kernel)
    graph.erase_node(sdpa)
    return kernel
