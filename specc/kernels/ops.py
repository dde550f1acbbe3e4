"""The kernels as PyTorch operators: `torch.ops.specc.tree_attention` and
`torch.ops.specc.greedy_accept`.

Each is a `torch.library.custom_op` with a fake (meta) implementation, so
`torch.export`, AOT autograd and Inductor trace through it as one opaque
call; its CPU and CUDA implementations pick the Triton kernel or the
PyTorch reference as `specc.kernels.dispatch` explains, and any other
device runs the reference. tree_attention's backward recomputes the
reference under autograd (compile-time training steps through it; no
backward kernel is written).
"""

from __future__ import annotations

import torch

from specc.kernels import reference
from specc.kernels.dispatch import cpu_runs_triton, triton_kernel_module


@torch.library.custom_op("specc::tree_attention", mutates_args=())
def tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                   scale: float | None = None) -> torch.Tensor:
    """Masked attention `[batch, heads, q, head_dim]` over keys/values `[batch, kv_heads, kv, head_dim]`
    (heads a multiple of kv_heads); mask boolean (True = may attend) or additive, broadcast to
    `[batch, heads, q, kv]`. Equal to `F.scaled_dot_product_attention(..., enable_gqa=True)`."""
    return reference.tree_attention(query, key, value, mask, scale)


@tree_attention.register_kernel("cpu")
def _tree_attention_cpu(query, key, value, mask, scale=None):
    if cpu_runs_triton():
        return triton_kernel_module("tree_attention").tree_attention(query, key, value, mask, scale)
    return reference.tree_attention(query, key, value, mask, scale)


@tree_attention.register_kernel("cuda")
def _tree_attention_cuda(query, key, value, mask, scale=None):
    return triton_kernel_module("tree_attention").tree_attention(query, key, value, mask, scale)


@tree_attention.register_fake
def _tree_attention_fake(query, key, value, mask, scale=None):
    reference.check_tree_attention_inputs(query, key, value, mask)
    return torch.empty_like(query, memory_format=torch.contiguous_format)


def _save_attention_inputs(ctx, inputs, output):
    query, key, value, mask, scale = inputs
    ctx.save_for_backward(query, key, value, mask)
    ctx.scale = scale


def _attention_backward(ctx, grad_output):
    query, key, value, mask = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(needs) for t, needs in zip((query, key, value), ctx.needs_input_grad)]
        output = reference.tree_attention(*leaves, mask, ctx.scale)
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        grads = iter(torch.autograd.grad(output, wanted, grad_output) if wanted else ())
    return (*(next(grads) if leaf.requires_grad else None for leaf in leaves), None, None)


tree_attention.register_autograd(_attention_backward, setup_context=_save_attention_inputs)


@torch.library.custom_op("specc::greedy_accept", mutates_args=())
def greedy_accept(logits: torch.Tensor, node_tokens: torch.Tensor,
                  parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance of a token tree: `logits [nodes, vocab]` (the target's prediction after
    each node), `node_tokens [nodes]`, `parents [nodes]` (root 0 with parent -1, parents before
    children). Returns the accepted nodes root first, padded with -1 to `[nodes]`, and the bonus
    token (the argmax at the last accepted node) as a 0-d tensor."""
    return reference.greedy_accept(logits, node_tokens, parents)


@greedy_accept.register_kernel("cpu")
def _greedy_accept_cpu(logits, node_tokens, parents):
    if cpu_runs_triton():
        reference.check_tree_order(parents.tolist())   # on the host already: checking is free
        return triton_kernel_module("greedy_accept").greedy_accept(logits, node_tokens, parents)
    return reference.greedy_accept(logits, node_tokens, parents)


@greedy_accept.register_kernel("cuda")
def _greedy_accept_cuda(logits, node_tokens, parents):
    return triton_kernel_module("greedy_accept").greedy_accept(logits, node_tokens, parents)


@greedy_accept.register_fake
def _greedy_accept_fake(logits, node_tokens, parents):
    reference.check_greedy_accept_inputs(logits, node_tokens, parents)
    nodes = logits.shape[0]
    return logits.new_empty((nodes,), dtype=torch.int64), logits.new_empty((), dtype=torch.int64)
