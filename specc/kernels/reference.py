"""Plain PyTorch definitions of what each kernel computes, and the input checks
both implementations share.

These are the specifications the Triton kernels are tested against, and
what the ops run wherever Triton cannot (a CPU without `TRITON_INTERPRET=1`).
"""

from __future__ import annotations

import math

import torch


def check_tree_attention_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                mask: torch.Tensor, kv_len: torch.Tensor | None = None) -> None:
    """Ranks, static sizes, dtypes and devices: what a fake tensor can be checked for."""
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
    if kv_len is not None and (kv_len.dim() != 0 or kv_len.dtype not in (torch.int32, torch.int64)
                               or kv_len.device != key.device):
        raise ValueError(f"tree_attention: kv_len is a 0-d int32 or int64 tensor on the keys' device "
                         f"({key.device}); got {kv_len.dtype} {tuple(kv_len.shape)} on {kv_len.device}")


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
                   scale: float | None = None, kv_len: torch.Tensor | None = None) -> torch.Tensor:
    """`F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
    enable_gqa=True)`, written out: fp32 scores and softmax, and rows that may
    attend to nothing give zeros (as SDPA does). With `kv_len` (a 0-d integer
    tensor), keys at index `kv_len` and past are masked out as well: only the
    live part of the cache is read (compared on the device, no host sync)."""
    check_tree_attention_inputs(query, key, value, mask, kv_len)
    check_mask_broadcasts(query, key, mask)
    group = query.shape[1] // key.shape[1]
    keys = key.float().repeat_interleave(group, dim=1)
    values = value.float().repeat_interleave(group, dim=1)
    scores = query.float() @ keys.transpose(-1, -2) * default_scale(query, scale)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask.float()
    if kv_len is not None:
        scores = scores.masked_fill(torch.arange(key.shape[2], device=key.device) >= kv_len, float("-inf"))
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


def check_sample_accept_inputs(target_probs: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                               uniforms: torch.Tensor, draft_probs: torch.Tensor | None) -> None:
    check_greedy_accept_inputs(target_probs, node_tokens, parents)
    nodes, vocab = target_probs.shape
    if target_probs.dtype != torch.float32:
        raise ValueError(f"sample_accept takes float32 target probabilities; got {target_probs.dtype}")
    if uniforms.shape != (nodes + 1,) or uniforms.dtype != torch.float32:
        raise ValueError(f"sample_accept: uniforms must be float32 [nodes + 1] = [{nodes + 1}] (one per node's "
                         f"test, then the final draw); got {uniforms.dtype} {tuple(uniforms.shape)}")
    if draft_probs is not None and (draft_probs.shape != (max(nodes - 1, 0), vocab)
                                    or draft_probs.dtype != torch.float32):
        raise ValueError(f"sample_accept: draft_probs (a sampled chain's q per depth) must be float32 "
                         f"[nodes - 1, vocab] = [{nodes - 1}, {vocab}]; got {draft_probs.dtype} "
                         f"{tuple(draft_probs.shape)}")


def sample_accept(target_probs: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                  uniforms: torch.Tensor, draft_probs: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling acceptance driven by given uniforms (`uniforms[c]` decides node c,
    `uniforms[nodes]` draws the final token), so the kernel can be compared draw for draw.

    With `draft_probs` (a chain sampled from q; row d-1 is q for depth d): node c is accepted
    when `u_c < min(1, p(x) / q(x))` (p the target's prediction at its parent); on a rejection the
    token is drawn from `max(p - q, 0)` renormalised (p where that is empty). Without (a tree of
    deterministic candidates): a node's children are tried in node order, each as a point mass,
    accepted when `u_c < p'(x)`, p' being p with the already rejected siblings' tokens removed and
    renormalised; if all are rejected the token is drawn from p'. When the walk reaches a node
    without children the token is drawn from its p. Draws: the first token whose cumulative
    weight exceeds `u * total`. Returns the path padded with -1 and the token, like greedy_accept."""
    check_sample_accept_inputs(target_probs, node_tokens, parents, uniforms, draft_probs)
    parent_list = parents.tolist()
    check_tree_order(parent_list)
    tokens, draws = node_tokens.tolist(), uniforms.tolist()
    probs = target_probs.detach().cpu().double()
    drafts = None if draft_probs is None else draft_probs.detach().cpu().double()
    path, current = [0], 0
    while True:
        children = [c for c in range(1, len(parent_list)) if parent_list[c] == current]
        rejected: list[int] = []
        accepted = None
        for child in children:
            token = tokens[child]
            if drafts is not None:
                chance = min(1.0, float(probs[current, token]) / max(float(drafts[current, token]), 1e-20))
            elif token in rejected:
                chance = 0.0
            else:
                left = 1.0 - sum(float(probs[current, t]) for t in set(rejected))
                chance = float(probs[current, token]) / left if left > 0 else 0.0
            if draws[child] < chance:
                accepted = child
                break
            rejected.append(token)
        if accepted is None:
            break
        path.append(accepted)
        current = accepted
    weights = probs[current].clone()
    if children and drafts is not None:
        weights = (weights - drafts[current]).clamp(min=0.0)
    elif children:
        weights[rejected] = 0.0
    if float(weights.sum()) <= 0.0:
        weights = probs[current]
    cumulative = weights.cumsum(0)
    token = int(torch.searchsorted(cumulative, draws[-1] * float(cumulative[-1]), right=True).clamp(
        max=len(cumulative) - 1))
    padded = torch.full((len(parent_list),), -1, dtype=torch.int64, device=target_probs.device)
    padded[:len(path)] = torch.tensor(path, dtype=torch.int64)
    return padded, torch.tensor(token, dtype=torch.int64, device=target_probs.device)
