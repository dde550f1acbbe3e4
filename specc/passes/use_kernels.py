"""Run cached attention through specc's Triton kernel, `torch.ops.specc.tree_attention`.

Each masked scaled_dot_product_attention that reads the KV cache (the form
`insert_kv_cache` leaves: `sdpa(query, keys, values, attn_mask, scale=…,
enable_gqa=True)`) becomes `specc.tree_attention(query, keys, values,
attn_mask, scale)`, the same computation. Segment submodules are rewritten
too, so the pass can run last, after passes that look for SDPA nodes
(`insert_skip_branches`) and after `segment_by_layer`.

It is opt-in (`specc compile --kernels`): specc engines run on the CPU,
where the op computes its PyTorch reference (or interprets the Triton
kernel under `TRITON_INTERPRET=1`), so the kernel only pays off on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import attention_nodes
from specc.graph.patterns import is_cached_attention
from specc.graph.tidy import tidy
from specc.kernels import KERNELS
from specc.passes.base import GraphPass, PassResult

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
        for module in _graph_modules(gm):
            pending = attention_nodes(module.graph)
            if not pending:
                continue
            for sdpa in pending:
                _check_rewritable(sdpa)
                replaced.append(sdpa.name)
                inserted.append(_swap_for_kernel(module.graph, sdpa).name)
            tidy(module)
        if not replaced:
            return PassResult.unchanged(gm)
        return PassResult(gm, True, inserted=inserted, replaced=replaced)


def _graph_modules(gm: fx.GraphModule) -> list[fx.GraphModule]:
    """`gm` and the GraphModules it calls (layer segments)."""
    called = [gm.get_submodule(n.target) for n in gm.graph.nodes if n.op == "call_module"]
    return [gm, *(m for m in called if isinstance(m, fx.GraphModule))]


def _check_rewritable(sdpa: fx.Node) -> None:
    if not is_cached_attention(sdpa):
        raise SpeccError(f"attention node {sdpa.name} does not read a KV cache; use_kernels runs after "
                         f"insert_kv_cache (put it after the infrastructure passes)")
    unexpected = sorted(set(sdpa.kwargs) - _REWRITTEN_KWARGS)
    if len(sdpa.args) != 4 or unexpected:
        raise SpeccError(f"attention node {sdpa.name} is not the masked form insert_kv_cache leaves "
                         f"(args {len(sdpa.args)}, expected query, keys, values, mask; unexpected keyword "
                         f"arguments {unexpected or 'none'}); tree_attention cannot replace it")


def _swap_for_kernel(graph: fx.Graph, sdpa: fx.Node) -> fx.Node:
    query, keys, values, mask = sdpa.args
    with graph.inserting_before(sdpa):
        kernel = graph.call_function(KERNELS["tree_attention"].op, (query, keys, values, mask),
                                     {"scale": sdpa.kwargs.get("scale")})
    kernel.meta.update(sdpa.meta)   # nn_module_stack (layer lookup) and the fake value, unchanged
    sdpa.replace_all_uses_with(kernel)
    graph.erase_node(sdpa)
    return kernel
