"""`torch.ops.specc.row_attention`: masked attention computed row by row on the CPU
(`cpu/row_attention.cpp`, compiled on first use into specc's CPU library, which registers it
as the operator's CPU implementation: `cpu/torch_ops.cpp`), the attention of quantized engines.

It computes `F.scaled_dot_product_attention(query, key, value, attn_mask=mask,
scale=scale, enable_gqa=True)` for a boolean mask, in fp32 with one rounding to the
output's dtype, each (batch, head, query row) on its own: a row's bits never depend
on the call's other rows nor on the keys its mask hides (the C++ header says how).
PyTorch's CPU attention groups rows and keys into blocks, so in bfloat16 a row's
result moved with the call's row count; quantized engines padded every attention
call to 4 rows to keep verification rows equal to decode steps, and its fixed cost
per call (~50-90 us at 64-128 keys on this repository's 2-core machine) was the
largest part of a q4 decode step outside the matmuls (docs/quantization.md).
"""

from __future__ import annotations

import ctypes
import math

import torch

from specc.kernels.cpu.build import NATIVE, load_library

LIBRARY = NATIVE
DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def check_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
    devices = sorted({str(t.device) for t in (query, key, value, mask)})
    if devices != ["cpu"]:
        raise ValueError(f"row_attention runs on the CPU, got tensors on {devices}")
    if any(t.dim() != 4 for t in (query, key, value, mask)):
        raise ValueError(f"row_attention takes 4-d query, key, value and mask, got "
                         f"{[t.dim() for t in (query, key, value, mask)]} dimensions")
    if query.dtype not in DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(f"row_attention takes float32 or bfloat16 query, key and value of one dtype, got "
                         f"{query.dtype}, {key.dtype}, {value.dtype}")
    if mask.dtype != torch.bool:
        raise ValueError(f"row_attention takes a boolean mask (True: may attend), got {mask.dtype}")
    batch, heads, rows, dim = query.shape
    if key.shape != value.shape or key.shape[0] != batch or key.shape[3] != dim or heads % key.shape[1]:
        raise ValueError(f"row_attention: keys {list(key.shape)} and values {list(value.shape)} do not serve "
                         f"a query {list(query.shape)} (same batch and head_dim, heads a multiple of kv_heads)")
    try:
        torch.broadcast_shapes(mask.shape, (batch, heads, rows, key.shape[2]))
    except RuntimeError:
        raise ValueError(f"row_attention: a mask {list(mask.shape)} does not broadcast to "
                         f"{[batch, heads, rows, key.shape[2]]}") from None


def output_layout(shape: torch.Size) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The output's size `[batch, heads, rows, dim]` and strides: laid out `[batch, rows, heads,
    dim]`, the layout the output projection reads, so the graph's transpose back is a view."""
    batch, heads, rows, dim = shape
    return (batch, heads, rows, dim), (rows * heads * dim, dim, heads * dim, 1)


def _strides(tensor: torch.Tensor, shape: torch.Size) -> ctypes.Array:
    """`tensor`'s strides broadcast to `shape` (0 on an expanded axis), as a C int64[4]."""
    expanded = tensor.expand(shape)
    return (ctypes.c_int64 * 4)(*expanded.stride())


def _last_axis_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 or tensor.shape[-1] == 1 else tensor.contiguous()


def _run(query, key, value, mask, scale):
    check_inputs(query, key, value, mask)
    query, key, value = (_last_axis_contiguous(t) for t in (query, key, value))
    batch, heads, rows, dim = query.shape
    kv_heads, kv = key.shape[1], key.shape[2]
    out = torch.empty_strided(*output_layout(query.shape), dtype=query.dtype)
    status = load_library(LIBRARY).specc_row_attention(
        ctypes.c_void_p(query.data_ptr()), _strides(query, query.shape), ctypes.c_void_p(key.data_ptr()),
        _strides(key, key.shape), ctypes.c_void_p(value.data_ptr()), _strides(value, value.shape),
        ctypes.c_void_p(mask.data_ptr()), _strides(mask, (batch, heads, rows, kv)), batch, heads, kv_heads, rows,
        kv, dim, ctypes.c_float(scale if scale is not None else 1 / math.sqrt(dim)), DTYPES[query.dtype],
        ctypes.c_void_p(out.data_ptr()))
    if status != 0:
        raise ValueError(f"row_attention refused its arguments (status {status})")
    return out


torch.library.define("specc::row_attention",
                     "(Tensor query, Tensor key, Tensor value, Tensor mask, float? scale=None) -> Tensor")


# The CPU implementation is C++ (`cpu/torch_ops.cpp`), registered when specc's CPU library loads;
# until then this one stands in: it loads the library and computes its call through ctypes.
@torch.library.impl("specc::row_attention", "CompositeExplicitAutograd")
def _row_attention_until_loaded(query, key, value, mask, scale=None):
    return _run(query, key, value, mask, scale)


@torch.library.register_fake("specc::row_attention")
def _row_attention_fake(query, key, value, mask, scale=None):
    return query.new_empty_strided(*output_layout(query.shape))


def row_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                  scale: float | None = None) -> torch.Tensor:
    """Attention `[batch, heads, q, head_dim]` of `query` over `key`/`value` `[batch, kv_heads, kv,
    head_dim]` (CPU, float32 or bfloat16) under a boolean `mask` broadcast to `[batch, heads, q, kv]`
    (True: may attend); a row that may attend to nothing gives zeros."""
    return torch.ops.specc.row_attention.default(query, key, value, mask, scale)
