"""`torch.ops.specc.blocked_matmul`: low-bit weights in blocks of 32 inputs times 8-bit
activations, on the CPU (`cpu/blocked_matmul.cpp`, compiled on first use into specc's CPU
library, which registers it as the operator's CPU implementation: `cpu/torch_ops.cpp`).

The weight layout is the kernel's contract, so it is written here (`pack_blocked`,
`unpack_blocked`): per tile of 16 output features and block of 32 inputs, 16 fp16
scales, 16 fp16 mins, then the values q (4 or 8 bits), w = min + q * scale (min/max
per block: GGUF Q4_1's format at 4 bits). Activations are quantized by the kernel per
row and block to int8 with one fp32 scale (amax / 127, llama.cpp's Q8_0). Every row is
computed the same way whatever the other rows of the call, bit for bit (the kernel's
header says how); `reference` is the same arithmetic in PyTorch, equal to it within
fp32 rounding (its sums run in another order).
"""

from __future__ import annotations

import ctypes

import torch

from specc.kernels.cpu.build import NATIVE, load_library

BLOCK = 32        # inputs per scale and min
TILE = 16         # output features interleaved per tile
BITS = (4, 8)
LIBRARY = NATIVE


def fits(weight_shape: torch.Size | tuple[int, int]) -> bool:
    out_features, in_features = weight_shape
    return out_features % TILE == 0 and in_features % BLOCK == 0


def pack_blocked(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """A floating `[out, in]` weight as the kernel's uint8 tiles `[out / 16, in / 32, bytes]`."""
    out_features, in_features = weight.shape
    blocks, tiles, levels = in_features // BLOCK, out_features // TILE, (1 << bits) - 1
    grouped = weight.detach().float().reshape(out_features, blocks, BLOCK)
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    scales = ((high - low) / levels).to(torch.float16)
    mins = low.to(torch.float16)
    safe = torch.where(scales.float() > 0, scales.float(), torch.ones_like(low))
    q = torch.round((grouped - mins.float()[..., None]) / safe[..., None]).clamp(0, levels).to(torch.uint8)
    chunks = q.reshape(tiles, TILE, blocks, 8, 4).permute(0, 2, 3, 1, 4)   # tile, block, chunk, feature, 4 inputs
    values = chunks[:, :, :4] | (chunks[:, :, 4:] << 4) if bits == 4 else chunks
    return torch.cat([_per_tile(scales, tiles, blocks), _per_tile(mins, tiles, blocks),
                      values.reshape(tiles, blocks, -1)], dim=-1).contiguous()


def _per_tile(values: torch.Tensor, tiles: int, blocks: int) -> torch.Tensor:
    return values.reshape(tiles, TILE, blocks).transpose(1, 2).contiguous().view(torch.uint8)


def unpack_blocked(packed: torch.Tensor, bits: int, out_features: int) -> tuple[torch.Tensor, ...]:
    """(q `[out, in / 32, 32]` uint8, scales and mins `[out, in / 32]` float16) of `pack_blocked`."""
    tiles, blocks, _ = packed.shape
    scales = packed[..., :2 * TILE].contiguous().view(torch.float16).transpose(1, 2).reshape(out_features, blocks)
    mins = packed[..., 2 * TILE:4 * TILE].contiguous().view(torch.float16).transpose(1, 2).reshape(out_features, blocks)
    values = packed[..., 4 * TILE:]
    if bits == 4:
        values = values.reshape(tiles, blocks, 4, TILE, 4)
        values = torch.cat([values & 0x0F, values >> 4], dim=2)
    chunks = values.reshape(tiles, blocks, 8, TILE, 4).permute(0, 3, 1, 2, 4)
    return chunks.reshape(out_features, blocks, BLOCK), scales, mins


def reference(rows: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int) -> torch.Tensor:
    """The kernel's arithmetic in PyTorch, fp32 (the kernel rounds its output to bfloat16)."""
    q, scales, mins = unpack_blocked(packed, bits, out_features)
    x = rows.float().reshape(rows.shape[0], -1, BLOCK)
    a_scales = x.abs().amax(dim=-1) / 127
    qa = torch.round(x / torch.where(a_scales > 0, a_scales, torch.ones_like(a_scales))[..., None])
    weight = q.float() * scales.float()[..., None] + mins.float()[..., None]
    return (qa * a_scales[..., None]).reshape(rows.shape[0], -1) @ weight.reshape(out_features, -1).T


def vectorized() -> bool:
    """Whether this machine's build runs the AVX-512 VNNI path (else the portable scalar one)."""
    return bool(load_library(LIBRARY).specc_blocked_matmul_vectorized())


def check_inputs(rows: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int) -> None:
    if rows.device.type != "cpu" or packed.device.type != "cpu":
        raise ValueError(f"blocked_matmul runs on the CPU, got rows on {rows.device} and weights on {packed.device}")
    if rows.dim() != 2 or rows.dtype != torch.bfloat16:
        raise ValueError(f"blocked_matmul takes bfloat16 rows [n, in], got {rows.dtype} {list(rows.shape)}")
    if bits not in BITS or packed.dtype != torch.uint8 or packed.dim() != 3:
        raise ValueError(f"blocked_matmul takes a uint8 weight [out/16, in/32, bytes] of 4 or 8 bits, got "
                         f"{packed.dtype} {list(packed.shape)} at {bits} bits")
    tiles, blocks, nbytes = packed.shape
    if tiles * TILE != out_features or blocks * BLOCK != rows.shape[1] or nbytes != 4 * TILE + TILE * BLOCK * bits // 8:
        raise ValueError(f"blocked_matmul: a weight of {tiles} tiles x {blocks} blocks x {nbytes} bytes does not "
                         f"map {rows.shape[1]} inputs to {out_features} outputs at {bits} bits")


def _run(rows: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int, scalar: bool) -> torch.Tensor:
    check_inputs(rows, packed, bits, out_features)
    rows, packed = rows.contiguous(), packed.contiguous()
    out = torch.empty(rows.shape[0], out_features, dtype=torch.bfloat16)
    status = load_library(LIBRARY).specc_blocked_matmul(
        ctypes.c_void_p(rows.data_ptr()), rows.shape[0], rows.shape[1], ctypes.c_void_p(packed.data_ptr()),
        out_features, bits, ctypes.c_void_p(out.data_ptr()), int(scalar))
    if status != 0:
        raise ValueError(f"blocked_matmul refused its arguments (status {status})")
    return out


torch.library.define("specc::blocked_matmul", "(Tensor rows, Tensor packed, int bits, int out_features) -> Tensor")


# The CPU implementation is C++ (`cpu/torch_ops.cpp`), registered when specc's CPU library loads;
# until then this one stands in: it loads the library and computes its call through ctypes.
@torch.library.impl("specc::blocked_matmul", "CompositeExplicitAutograd")
def _blocked_matmul_until_loaded(rows, packed, bits, out_features):
    return _run(rows, packed, bits, out_features, scalar=False)


@torch.library.register_fake("specc::blocked_matmul")
def _blocked_matmul_fake(rows, packed, bits, out_features):
    return rows.new_empty(rows.shape[0], out_features)


def blocked_matmul(rows: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int) -> torch.Tensor:
    """`rows [n, in]` (bfloat16, CPU) times the transpose of the weight `pack_blocked` packed: `[n, out]`."""
    return torch.ops.specc.blocked_matmul.default(rows, packed, bits, out_features)


def scalar_blocked_matmul(rows: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int) -> torch.Tensor:
    """The kernel's portable path, forced (what a CPU without AVX-512 VNNI runs): for tests."""
    return _run(rows, packed, bits, out_features, scalar=True)
