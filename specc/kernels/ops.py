"""The kernels as PyTorch operators: `torch.ops.specc.tree_attention`,
`torch.ops.specc.greedy_accept` and `torch.ops.specc.sample_accept`.

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
                   scale: float | None = None, kv_len: torch.Tensor | None = None) -> torch.Tensor:
    """Masked attention `[batch, heads, q, head_dim]` over keys/values `[batch, kv_heads, kv, head_dim]`
    (heads a multiple of kv_heads); mask boolean (True = may attend) or additive, broadcast to
    `[batch, heads, q, kv]`. Equal to `F.scaled_dot_product_attention(..., enable_gqa=True)`.

    `kv_len`, optional, is the live length of the cache: a 0-d int32/int64 tensor on the
    device (never a Python int, so a captured CUDA graph replays with the current value; the
    kernel reads it and its grid stays static). Keys at index `kv_len` and past count as
    masked, and the kernel never loads them, so a 2,048-slot cache holding 300 tokens should
    cost about what 300 slots do (not yet measured on a GPU). In specc's graphs `use_kernels`
    passes `max(cache_positions) + 1`, computed on the device: the slot after the last row
    this call writes. The graph has no live-length scalar of its own (the keys are a view as
    wide as the mask, which the runtime pads, `runtime.masks.pad_keys`; position ids are tree
    depths, not slots), and every key a row may see (the committed prefix, this call's rows)
    lies before that slot. Without `kv_len` the whole key axis is live."""
    return reference.tree_attention(query, key, value, mask, scale, kv_len)


@tree_attention.register_kernel("cpu")
def _tree_attention_cpu(query, key, value, mask, scale=None, kv_len=None):
    if cpu_runs_triton():
        return triton_kernel_module("tree_attention").tree_attention(query, key, value, mask, scale, kv_len)
    return reference.tree_attention(query, key, value, mask, scale, kv_len)


@tree_attention.register_kernel("cuda")
def _tree_attention_cuda(query, key, value, mask, scale=None, kv_len=None):
    return triton_kernel_module("tree_attention").tree_attention(query, key, value, mask, scale, kv_len)


@tree_attention.register_fake
def _tree_attention_fake(query, key, value, mask, scale=None, kv_len=None):
    reference.check_tree_attention_inputs(query, key, value, mask, kv_len)
    return torch.empty_like(query, memory_format=torch.contiguous_format)


def _save_attention_inputs(ctx, inputs, output):
    query, key, value, mask, scale, kv_len = inputs
    ctx.save_for_backward(query, key, value, mask, kv_len)
    ctx.scale = scale


def _attention_backward(ctx, grad_output):
    query, key, value, mask, kv_len = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(needs) for t, needs in zip((query, key, value), ctx.needs_input_grad)]
        output = reference.tree_attention(*leaves, mask, ctx.scale, kv_len)
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        grads = iter(torch.autograd.grad(output, wanted, grad_output) if wanted else ())
    return (*(next(grads) if leaf.requires_grad else None for leaf in leaves), None, None, None)


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


@torch.library.custom_op("specc::sample_accept", mutates_args=())
def sample_accept(target_probs: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                  uniforms: torch.Tensor, draft_probs: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative-sampling acceptance of a drafted chain (with `draft_probs`, q per depth) or tree
    of point-mass candidates (without), driven by the caller's `uniforms [nodes + 1]`. Returns the
    accepted nodes root first, padded with -1 to `[nodes]`, and the next token (0-d). The rule:
    `specc.kernels.reference.sample_accept`."""
    return reference.sample_accept(target_probs, node_tokens, parents, uniforms, draft_probs)


@sample_accept.register_kernel("cpu")
def _sample_accept_cpu(target_probs, node_tokens, parents, uniforms, draft_probs=None):
    if cpu_runs_triton():
        reference.check_tree_order(parents.tolist())   # on the host already: checking is free
        return triton_kernel_module("sample_accept").sample_accept(target_probs, node_tokens, parents, uniforms,
                                                                   draft_probs)
    return reference.sample_accept(target_probs, node_tokens, parents, uniforms, draft_probs)


@sample_accept.register_kernel("cuda")
def _sample_accept_cuda(target_probs, node_tokens, parents, uniforms, draft_probs=None):
    return triton_kernel_module("sample_accept").sample_accept(target_probs, node_tokens, parents, uniforms,
                                                               draft_probs)


@sample_accept.register_fake
def _sample_accept_fake(target_probs, node_tokens, parents, uniforms, draft_probs=None):
    reference.check_sample_accept_inputs(target_probs, node_tokens, parents, uniforms, draft_probs)
    nodes = target_probs.shape[0]
    return target_probs.new_empty((nodes,), dtype=torch.int64), target_probs.new_empty((), dtype=torch.int64)
