"""Plain PyTorch definitions of what each kernel computes, and the input checks
both implementations share.

These are the specifications the Triton kernels are tested against, and
what the ops run wherever Triton cannot (a CPU without `TRITON_INTERPRET=1`).
"""

from __future__ import annotations

import math

import torch


def check_tree_attention_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                mask: torch.Tensor) -> None:
    """Ranks, static sizes and dtypes: what a fake tensor can be checked for."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"tree_attention takes [batch, heads, len, head_dim] tensors; got query "
                         f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
    if key.shape != value.shape:
        raise ValueError(f"tree_attention: key {tuple(key.shape)} and value {tuple(value.shape)} differ in shape")
    batch, heads, q_len, head_dim = query.shape
    if key.shape[0] != batch or key.shape[3] != head_dim:
        raise ValueError(f"tree_attention: key {tuple(key.shape)} does not match query {tuple(query.shape)} "
                         f"in batch or head_dim")
    if heads % key.shape[1] != 0:
        raise ValueError(f"tree_attention: {heads} query heads are not a multiple of {key.shape[1]} kv heads")
    if not (query.dtype == key.dtype == value.dtype) or not query.dtype.is_floating_point:
        raise ValueError(f"tree_attention: query, key and value must share one floating dtype; got "
                         f"{query.dtype}, {key.dtype}, {value.dtype}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise ValueError(f"tree_attention: the mask is boolean (True = may attend) or additive float; "
                         f"got {mask.dtype}")
    if mask.dim() != 4:
        raise ValueError(f"tree_attention: the mask is [batch or 1, heads or 1, q, kv]; got {tuple(mask.shape)}")


def check_mask_broadcasts(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor) -> None:
    """On real tensors only: under export the sizes are symbols, and comparing
    them would add guards the graph's dynamic q and kv must not get."""
    batch, heads, q_len, _ = query.shape
    try:
        torch.broadcast_shapes(mask.shape, (batch, heads, q_len, key.shape[2]))
    except RuntimeError:
        raise ValueError(f"tree_attention: mask {tuple(mask.shape)} does not broadcast to "
                         f"[batch, heads, q, kv] = {[batch, heads, q_len, key.shape[2]]}") from None


def tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                   scale: float | None = None) -> torch.Tensor:
    """`F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
    enable_gqa=True)`, written out: fp32 scores and softmax, and rows that may
    attend to nothing give zeros (as SDPA does)."""
    check_tree_attention_inputs(query, key, value, mask)
    check_mask_broadcasts(query, key, mask)
    group = query.shape[1] // key.shape[1]
    keys = key.float().repeat_interleave(group, dim=1)
    values = value.float().repeat_interleave(group, dim=1)
    scores = query.float() @ keys.transpose(-1, -2) * default_scale(query, scale)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask.float()
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)   # an all -inf row is 0/0
    return (weights @ values).to(query.dtype)


def default_scale(query: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def check_greedy_accept_inputs(logits: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor) -> None:
    """Shapes and dtypes only; `check_tree_order` reads the parent values."""
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"greedy_accept takes float logits [nodes, vocab]; got {logits.dtype} "
                         f"{tuple(logits.shape)}")
    nodes = logits.shape[0]
    for name, tensor in (("node_tokens", node_tokens), ("parents", parents)):
        if tensor.shape != (nodes,) or tensor.dtype != torch.int64:
            raise ValueError(f"greedy_accept: {name} must be int64 [nodes] = [{nodes}]; got {tensor.dtype} "
                             f"{tuple(tensor.shape)}")


def check_tree_order(parents: list[int]) -> None:
    """Node 0 is the root (parent -1) and every other node comes after its parent."""
    if not parents or parents[0] != -1:
        raise ValueError(f"greedy_accept: node 0 must be the root with parent -1; got parents {parents}")
    for node, parent in enumerate(parents[1:], start=1):
        if not 0 <= parent < node:
            raise ValueError(f"greedy_accept: node {node} has parent {parent}; parents must come before "
                             f"their children (0 <= parent < node)")


def greedy_accept(logits: torch.Tensor, node_tokens: torch.Tensor,
                  parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Follow the tree from the root while a child carries its parent's argmax
    (the first such child, in node order). Returns the accepted node indices,
    root first, padded with -1 to `[nodes]`, and the bonus token: the argmax
    at the last accepted node."""
    check_greedy_accept_inputs(logits, node_tokens, parents)
    parent_list = parents.tolist()
    check_tree_order(parent_list)
    best = logits.argmax(dim=-1).tolist()
    tokens = node_tokens.tolist()
    path, current = [0], 0
    # Children come after their parent, so one scan in node order finds the
    # first matching child of the current node before any of its descendants.
    for node in range(1, len(parent_list)):
        if parent_list[node] == current and tokens[node] == best[current]:
            path.append(node)
            current = node
    padded = torch.full((len(parent_list),), -1, dtype=torch.int64, device=logits.device)
    padded[:len(path)] = torch.tensor(path, dtype=torch.int64)
    return padded, torch.tensor(best[current], dtype=torch.int64, device=logits.device)
