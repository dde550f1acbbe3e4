"""The kernels specc provides, and which of them a graph calls."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

NAMESPACE = "specc"


@dataclass(frozen=True)
class Kernel:
    name: str      # the operator torch.ops.specc.<name>; its kernel: specc/kernels/<name>.py (Triton) or cpu/<name>.cpp
    summary: str
    # Raised when something a compiled graph relies on changes (an output's layout, an argument's
    # meaning): engines record the revision they were compiled against, and one compiled against
    # another is refused (specc/engine/verify.py) rather than run on a kernel it misreads.
    revision: int = 1
    revised: str = ""   # what the current revision changed

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(getattr(torch.ops, NAMESPACE), self.name).default


KERNELS = {kernel.name: kernel for kernel in (
    Kernel("tree_attention", "masked (tree) attention of q rows over the live part of the KV cache "
                             "(kv_len), split-KV per GQA group, row-invariant"),
    Kernel("greedy_accept", "per-node argmax and the longest root path whose tokens match it, "
                            "with the bonus token"),
    Kernel("sample_accept", "speculative-sampling acceptance of a sampled chain (p/q test, residual) or a "
                            "tree of point-mass candidates, from given uniforms"),
    Kernel("blocked_matmul", "4-, 6- or 8-bit weights in blocks of 32 (8-bit scale and min under an fp16 pair "
                             "per 8 blocks) times activations "
                             "quantized per row to int8, AVX-512 VNNI or AVX2 on the CPU, row-invariant"),
    Kernel("row_attention", "masked attention with each head and query row computed on its own in fp32, "
                            "hidden keys never read, on the CPU, row-invariant",
           revision=2, revised="its output [batch, heads, rows, dim] is laid out [batch, rows, heads, dim] "
                               "(2026-12-01)"),
    Kernel("decoder_chain", "a decoder layer from its attention's output to the next layer's projection (output "
                            "projection, residual adds, RMSNorms, SiLU-gated MLP) in one parallel region on the "
                            "CPU, row-invariant",
           revision=2, revised="takes its layer's four projections as one pack, each thread's shares together "
                               "(2026-12-01)"),
    Kernel("decoder_chain_into_cache", "decoder_chain on to the next attention's operands: the rotary embedding "
                                       "of q and k, k and v written into the caches, in the same region",
           revision=3, revised="adds the q/k/v bias it is given (next_bias) before the rotary embedding "
                               "(2026-12-01)"),
    Kernel("decoder_layer", "the layer's row attention, then decoder_chain_into_cache, in one parallel region",
           revision=3, revised="adds the q/k/v bias it is given (next_bias) before the rotary embedding "
                               "(2026-12-01)"),
    Kernel("decoder_stack", "decoder_layer for consecutive layers of one shape, in one call and one parallel "
                            "region"),
)}


def kernel_revisions(names) -> dict[str, int]:
    """The current revision of each named kernel."""
    return {name: KERNELS[name].revision for name in sorted(names)}


def kernels_in_graph(gm: fx.GraphModule) -> list[str]:
    """Names of the specc kernels `gm` (or a GraphModule it calls) runs, sorted."""
    names = {name for node in gm.graph.nodes if node.op == "call_function"
             for name in [_specc_op_name(node.target)] if name}
    for child in gm.children():
        if isinstance(child, fx.GraphModule):
            names.update(kernels_in_graph(child))
    return sorted(names)


def _specc_op_name(target) -> str | None:
    """`name` when `target` is torch.ops.specc.<name> (an overload, or the packet a symbolic trace records)."""
    if isinstance(target, torch._ops.OpOverload):
        target = target.overloadpacket
    if isinstance(target, torch._ops.OpOverloadPacket):
        namespace, _, name = target._qualified_op_name.partition("::")
        return name if namespace == NAMESPACE else None
    return None
