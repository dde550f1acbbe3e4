"""Triton kernels: masked attention of a few query rows over the live part of a KV cache.

Split-KV (flash-decoding), grouped by kv head:

1. `_split_kernel`, grid (batch x kv head, block of `BLOCK_M` rows, kv split). A
   program's rows are (query row, query head) pairs of one kv head's GQA group,
   so each K/V tile is loaded once for every query head that reads it. Split
   `s` covers keys `[s * SPLIT_KV, (s + 1) * SPLIT_KV)`; the program walks them
   in tiles of `BLOCK_KV` with an online softmax (running max `m`, denominator
   `l`, unnormalised output `acc`, in fp32, base-2 exponentials), and stops at
   the live length: tiles at or past `kv_len` are never loaded, so a 2,048-slot
   cache holding 300 tokens should cost about what a 300-slot one does
   (on an H100 the outputs were bitwise equal; the times so far were of
   launches, whose fixed cost hides the difference: specc/kernels/README.md). bf16/fp16 tiles go through
   `tl.dot` as they are, accumulating in fp32 (the softmax weights are rounded
   to the value dtype for the second product, as flash attention does); fp32
   tiles use IEEE fp32 (never TF32).
2. `_combine_kernel`, grid (batch x kv head, block of rows): for each row, the
   partial results of the live splits merged in split order:
   `M = max_s m_s`, `out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s`.
   When the cache has a single split (`kv slots <= SPLIT_KV`) the first kernel
   writes the normalised output itself and the second is not launched; that
   gives the same bits as combining one split (weight `2^0 = 1`).

Row invariance, by construction: a row's arithmetic never depends on how many
query rows the call has, nor on the tree. The split and tile boundaries are
fixed multiples of `SPLIT_KV` and `BLOCK_KV` over the key axis (independent of
q, and of the cache's slot count), the block of rows is always `BLOCK_M` rows
whatever q is, each output element of a `tl.dot` is its own row's dot product,
the combine runs over splits in a fixed order, and keys a row may not see
contribute exact zeros (`2^-inf`). So row i of a 64-row call is bitwise row i
of a 1-row call with the same mask row (tested in the interpreter, in bf16 and
fp32), and a 1-row decode step after p tokens gives the bits of the same row
inside a verification. On CUDA the block sizes (`BLOCK_KV`, warps, stages)
come from a small autotune list keyed by head_dim, GQA group and dtypes, never
by q or kv: within a process every call of a model's shape uses one config
(and Triton's autotune disk cache keeps that choice across processes on the
machine). Triton's interpreter (CPU tests) runs one fixed config.

The interpreter has no bf16 matmul (it multiplies the raw bits), so there the
tiles are upcast to fp32 before `tl.dot`; bf16 x bf16 products are exact in
fp32, so this is the arithmetic of a bf16 tensor-core product with fp32
accumulation, up to the order of the sum.

Imports triton: load it through `specc.kernels.dispatch`, never directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specc.kernels.reference import check_mask_broadcasts, check_tree_attention_inputs, default_scale

INTERPRETED = triton.knobs.runtime.interpret   # what @triton.jit saw when it decorated the kernels below
LOG2E = 1.4426950408889634   # 1 / ln 2

# Fixed sizes: none may depend on the number of query rows (row invariance).
BLOCK_M = 16 if INTERPRETED else 64       # (query row, query head) rows per program; tl.dot needs >= 16
SPLIT_KV = 64 if INTERPRETED else 512     # keys per split: the split boundaries are multiples of this
INTERPRETER_BLOCK_KV = 16                 # on CUDA, BLOCK_KV comes from CONFIGS (each divides SPLIT_KV)
BLOCK_ROWS_COMBINE = 16

# Autotuned on CUDA; every BLOCK_KV divides SPLIT_KV, so no tile crosses a split boundary.
CONFIGS = [
    triton.Config({"BLOCK_KV": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_KV": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_KV": 128}, num_warps=8, num_stages=2),
]
TILE_MULTIPLE = INTERPRETER_BLOCK_KV if INTERPRETED else max(config.kwargs["BLOCK_KV"] for config in CONFIGS)


# The row and key counts are plain integers in the compiled code: Triton would otherwise build
# separate variants for q = 1 and for counts divisible by 16, another compile each and a code
# path that depends on q.
_PLAIN_COUNTS = ["q_len", "kv_slots", "num_splits"]


@triton.jit(do_not_specialize=_PLAIN_COUNTS)
def _split_kernel(
    query, key, value, mask, kv_len_ptr, out, part_acc, part_m, part_l,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_ob, stride_oh, stride_om, stride_od,
    kv_heads, q_len, kv_slots, head_dim, num_splits, qk_scale,
    GROUP: tl.constexpr, HAS_KV_LEN: tl.constexpr, MASK_IS_BOOL: tl.constexpr, DOT_FP32: tl.constexpr,
    FUSED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT_KV: tl.constexpr,
):
    batch_kv_head = tl.program_id(0)
    batch = batch_kv_head // kv_heads
    kv_head = batch_kv_head % kv_heads
    split = tl.program_id(2)
    live = kv_slots
    if HAS_KV_LEN:
        live = tl.maximum(tl.minimum(tl.load(kv_len_ptr).to(tl.int32), kv_slots), 0)

    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)   # row r: query row r // GROUP, head r % GROUP
    q_rows = rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    dims = tl.arange(0, BLOCK_D)
    row_ok = q_rows < q_len
    dim_ok = dims < head_dim

    q = tl.load(query + batch * stride_qb + heads[:, None] * stride_qh + q_rows[:, None] * stride_qm
                + dims[None, :] * stride_qd, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    k_base = key + batch * stride_kb + kv_head * stride_kh
    v_base = value + batch * stride_vb + kv_head * stride_vh
    m_base = mask + batch * stride_mb + heads[:, None] * stride_mh + q_rows[:, None] * stride_mm

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    split_start = split * SPLIT_KV
    split_end = tl.minimum(split_start + SPLIT_KV, live)   # early exit: no tile at or past the live length
    for start in range(split_start, split_end, BLOCK_KV):
        cols = start + tl.arange(0, BLOCK_KV)
        col_ok = cols < live
        k_t = tl.load(k_base + cols[None, :] * stride_kn + dims[:, None] * stride_kd,
                      mask=dim_ok[:, None] & col_ok[None, :], other=0.0)
        if DOT_FP32:
            scores = tl.dot(q, k_t.to(tl.float32), input_precision="ieee")
        else:
            scores = tl.dot(q, k_t)
        scores = scores * qk_scale   # scale * log2(e): the softmax below is in base 2
        if MASK_IS_BOOL:
            allowed = tl.load(m_base + cols[None, :] * stride_mn, mask=row_ok[:, None] & col_ok[None, :], other=0)
            scores = tl.where((allowed != 0) & col_ok[None, :], scores, float("-inf"))
        else:
            bias = tl.load(m_base + cols[None, :] * stride_mn, mask=row_ok[:, None] & col_ok[None, :],
                           other=float("-inf")).to(tl.float32)
            scores = tl.where(col_ok[None, :], scores + bias * 1.4426950408889634, float("-inf"))

        new_max = tl.maximum(row_max, tl.max(scores, 1))
        # A row that has seen only -inf keeps a finite shift, so exp2 gives 0, not NaN.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        weights = tl.math.exp2(scores - shift[:, None])
        rescale = tl.math.exp2(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(weights, 1)
        v = tl.load(v_base + cols[:, None] * stride_vn + dims[None, :] * stride_vd,
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        # The weights are rounded to the value dtype for the product (a no-op for fp32).
        weights = weights.to(v.dtype)
        if DOT_FP32:
            acc = tl.dot(weights.to(tl.float32), v.to(tl.float32), acc * rescale[:, None], input_precision="ieee")
        else:
            acc = tl.dot(weights, v, acc * rescale[:, None])
        row_max = new_max

    if FUSED:   # a single split: normalise here; fully masked rows stay 0, as in SDPA
        result = acc / tl.where(row_sum > 0.0, row_sum, 1.0)[:, None]
        o_ptrs = (out + batch * stride_ob + heads[:, None] * stride_oh + q_rows[:, None] * stride_om
                  + dims[None, :] * stride_od)
        tl.store(o_ptrs, result.to(out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    else:
        total_rows = q_len * GROUP
        part = (batch_kv_head * num_splits + split) * total_rows + rows
        tl.store(part_m + part, row_max, mask=row_ok)
        tl.store(part_l + part, row_sum, mask=row_ok)
        tl.store(part_acc + part[:, None] * BLOCK_D + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit(do_not_specialize=_PLAIN_COUNTS)
def _combine_kernel(
    part_acc, part_m, part_l, kv_len_ptr, out,
    stride_ob, stride_oh, stride_om, stride_od,
    kv_heads, q_len, kv_slots, head_dim, num_splits,
    GROUP: tl.constexpr, HAS_KV_LEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT_KV: tl.constexpr,
):
    batch_kv_head = tl.program_id(0)
    batch = batch_kv_head // kv_heads
    kv_head = batch_kv_head % kv_heads
    live = kv_slots
    if HAS_KV_LEN:
        live = tl.maximum(tl.minimum(tl.load(kv_len_ptr).to(tl.int32), kv_slots), 0)
    live_splits = (live + SPLIT_KV - 1) // SPLIT_KV   # the splits past it were never filled

    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    q_rows = rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    dims = tl.arange(0, BLOCK_D)
    row_ok = q_rows < q_len
    total_rows = q_len * GROUP
    first = batch_kv_head * num_splits * total_rows + rows

    top = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for split in range(0, live_splits):
        top = tl.maximum(top, tl.load(part_m + first + split * total_rows, mask=row_ok, other=float("-inf")))
    shift = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for split in range(0, live_splits):   # fixed order: split 0 first
        part = first + split * total_rows
        weight = tl.math.exp2(tl.load(part_m + part, mask=row_ok, other=float("-inf")) - shift)
        total = total + weight * tl.load(part_l + part, mask=row_ok, other=0.0)
        acc = acc + weight[:, None] * tl.load(part_acc + part[:, None] * BLOCK_D + dims[None, :],
                                              mask=row_ok[:, None], other=0.0)
    result = acc / tl.where(total > 0.0, total, 1.0)[:, None]
    o_ptrs = (out + batch * stride_ob + heads[:, None] * stride_oh + q_rows[:, None] * stride_om
              + dims[None, :] * stride_od)
    tl.store(o_ptrs, result.to(out.dtype.element_ty), mask=row_ok[:, None] & (dims < head_dim)[None, :])


if INTERPRETED:
    _split = _split_kernel   # one config: the interpreter's results must not depend on timings
else:
    _split = triton.autotune(configs=CONFIGS, key=["GROUP", "BLOCK_D", "MASK_IS_BOOL", "DOT_FP32"],
                             cache_results=True)(_split_kernel)


def chosen_configs() -> dict[str, str]:
    """Autotune key -> the config it chose, so far in this process (empty on the interpreter)."""
    return {str(key): str(config) for key, config in getattr(_split, "cache", {}).items()}


def tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                   scale: float | None = None, kv_len: torch.Tensor | None = None, *,
                   split_kv: int | None = None) -> torch.Tensor:
    """Launch the kernels; same contract as `specc.kernels.reference.tree_attention`.

    `split_kv` (a multiple of the tile size) overrides `SPLIT_KV`, for tests only: the split
    boundaries are part of the arithmetic, so one engine must keep one value."""
    check_tree_attention_inputs(query, key, value, mask, kv_len)
    check_mask_broadcasts(query, key, mask)
    batch, heads, q_len, head_dim = query.shape
    kv_heads, kv_slots = key.shape[1], key.shape[2]
    group = heads // kv_heads
    split = SPLIT_KV if split_kv is None else split_kv
    if split % TILE_MULTIPLE:
        raise ValueError(f"tree_attention: split_kv {split} is not a multiple of the largest tile {TILE_MULTIPLE}")
    num_splits = max(1, triton.cdiv(kv_slots, split))
    fused = num_splits == 1
    block_d = max(16, triton.next_power_of_2(head_dim))
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if q_len == 0 or batch == 0:
        return out
    full_mask = mask.expand(batch, heads, q_len, kv_slots)   # a view: broadcast dims get stride 0
    total_rows = group * q_len
    # Unused buffers are still given with their real dtypes: the autotune key includes every
    # tensor argument's dtype, and one shape must get one config whether fused or not.
    if fused:
        part_acc = part_m = part_l = torch.empty(1, device=query.device, dtype=torch.float32)   # not touched
    else:
        part_m = torch.empty(batch * kv_heads, num_splits, total_rows, device=query.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(batch * kv_heads, num_splits, total_rows, block_d, device=query.device,
                               dtype=torch.float32)
    has_kv_len = kv_len is not None
    kv_len_ptr = (kv_len.to(torch.int64) if has_kv_len   # never read without HAS_KV_LEN
                  else torch.empty((), device=query.device, dtype=torch.int64))
    common = dict(GROUP=group, HAS_KV_LEN=has_kv_len, BLOCK_D=block_d, SPLIT_KV=split)
    tiles = {"BLOCK_KV": INTERPRETER_BLOCK_KV} if INTERPRETED else {}
    _split[(batch * kv_heads, triton.cdiv(total_rows, BLOCK_M), num_splits)](
        query, key, value, full_mask, kv_len_ptr, out, part_acc, part_m, part_l,
        *query.stride(), *key.stride(), *value.stride(), *full_mask.stride(), *out.stride(),
        kv_heads, q_len, kv_slots, head_dim, num_splits, default_scale(query, scale) * LOG2E,
        MASK_IS_BOOL=mask.dtype == torch.bool, DOT_FP32=INTERPRETED or query.dtype == torch.float32,
        FUSED=fused, BLOCK_M=BLOCK_M, **tiles, **common)
    if not fused:
        _combine_kernel[(batch * kv_heads, triton.cdiv(total_rows, BLOCK_ROWS_COMBINE))](
            part_acc, part_m, part_l, kv_len_ptr, out, *out.stride(),
            kv_heads, q_len, kv_slots, head_dim, num_splits, BLOCK_R=BLOCK_ROWS_COMBINE, **common)
    return out


# No tile crosses a split boundary: every tile size divides TILE_MULTIPLE, which divides SPLIT_KV.
assert SPLIT_KV % TILE_MULTIPLE == 0
assert INTERPRETED or all(TILE_MULTIPLE % config.kwargs["BLOCK_KV"] == 0 for config in CONFIGS)
