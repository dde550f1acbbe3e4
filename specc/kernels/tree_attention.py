"""Triton kernel: masked attention of a few query rows over the KV cache read view.

One program computes one block of query rows for one query head. It walks
the keys in blocks, keeping a running row maximum and softmax denominator
(online softmax, as flash attention does), so scores for the whole cache
never exist at once. Grouped-query attention reads kv head `head // group`.
The mask is boolean (True = may attend, what specc's graphs carry) or
additive float, broadcast to `[batch, heads, q, kv]` through zero strides.

Loaded values are upcast to fp32 and the dot products use IEEE fp32 (not
TF32): verification must reproduce the target's argmax, and the Triton
interpreter computes bf16 arithmetic wrongly without the upcast.

Imports triton: load it through `specc.kernels.dispatch`, never directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.kernels.reference import check_mask_broadcasts, check_tree_attention_inputs, default_scale

INTERPRETED = triton.knobs.runtime.interpret   # what @triton.jit saw when it decorated the kernel below
BLOCK_Q = 16    # tl.dot needs every block dimension >= 16
BLOCK_KV = 16


@triton.jit
def _tree_attention_kernel(
    query, key, value, mask, out,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_ob, stride_oh, stride_om, stride_od,
    heads, q_len, kv_len, head_dim, group, scale,
    MASK_IS_BOOL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_D: tl.constexpr,
):
    batch_head = tl.program_id(0)
    batch = batch_head // heads
    head = batch_head % heads
    kv_head = head // group
    rows = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < q_len
    dim_ok = dims < head_dim

    q_ptrs = query + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qm + dims[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    k_base = key + batch * stride_kb + kv_head * stride_kh
    v_base = value + batch * stride_vb + kv_head * stride_vh
    m_base = mask + batch * stride_mb + head * stride_mh

    row_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
    for start in range(0, kv_len, BLOCK_KV):
        cols = start + tl.arange(0, BLOCK_KV)
        col_ok = cols < kv_len
        k_t = tl.load(k_base + cols[None, :] * stride_kn + dims[:, None] * stride_kd,
                      mask=dim_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        scores = tl.dot(q, k_t, input_precision="ieee") * scale
        bias = tl.load(m_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn,
                       mask=row_ok[:, None] & col_ok[None, :], other=0)
        if MASK_IS_BOOL:
            scores = tl.where(bias != 0, scores, float("-inf"))
        else:
            scores = scores + bias.to(tl.float32)
        scores = tl.where(col_ok[None, :], scores, float("-inf"))

        new_max = tl.maximum(row_max, tl.max(scores, 1))
        # A row that has seen only -inf keeps a finite shift, so exp gives 0, not NaN.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        weights = tl.exp(scores - shift[:, None])
        rescale = tl.exp(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(weights, 1)
        v = tl.load(v_base + cols[:, None] * stride_vn + dims[None, :] * stride_vd,
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
        acc = acc * rescale[:, None] + tl.dot(weights, v, input_precision="ieee")
        row_max = new_max

    result = acc / tl.where(row_sum > 0.0, row_sum, 1.0)[:, None]   # fully masked rows stay 0, as in SDPA
    o_ptrs = out + batch * stride_ob + head * stride_oh + rows[:, None] * stride_om + dims[None, :] * stride_od
    tl.store(o_ptrs, result.to(out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                   scale: float | None = None) -> torch.Tensor:
    """Launch the kernel; same contract as `specc.kernels.reference.tree_attention`."""
    check_tree_attention_inputs(query, key, value, mask)
    check_mask_broadcasts(query, key, mask)
    batch, heads, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    full_mask = mask.expand(batch, heads, q_len, kv_len)   # a view: broadcast dims get stride 0
    grid = (batch * heads, triton.cdiv(q_len, BLOCK_Q))
    _tree_attention_kernel[grid](
        query, key, value, full_mask, out,
        *query.stride(), *key.stride(), *value.stride(), *full_mask.stride(), *out.stride(),
        heads, q_len, kv_len, head_dim, heads // key.shape[1], default_scale(query, scale),
        MASK_IS_BOOL=mask.dtype == torch.bool, BLOCK_Q=BLOCK_Q, BLOCK_KV=BLOCK_KV,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
    )
    return out
