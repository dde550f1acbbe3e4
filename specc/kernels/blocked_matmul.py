"""`torch.ops.specc.blocked_matmul`: low-bit weights in blocks of 32 inputs times 8-bit
activations, on the CPU (`cpu/blocked_matmul.cpp`, compiled on first use into specc's CPU
library, which registers it as the operator's CPU implementation: `cpu/torch_ops.cpp`).

The weight layout is the kernel's contract, so it is written here (`pack_blocked`,
`unpack_blocked`). Per tile of 16 output features the inputs come in blocks of 32, and
the blocks in groups of up to 8 (256 inputs, GGUF's k-quant super-blocks). A group
holds 16 fp16 scales d and 16 fp16 mins m, then per block 16 8-bit sub-scales s
(0..255) and 16 signed 8-bit sub-mins n (-127..127), padded to 64 bytes, then each
block's values q (4, 6 or 8 bits): w = (d * s) * q + m * n, with min and max per block
(GGUF Q4_1's arithmetic) at 4.625 bits a weight where an fp16 scale and min per block
took 5. Activations are quantized by the kernel per row and block to int8 with one fp32
scale (amax / 127, llama.cpp's Q8_0). Every row is computed the same way whatever the
other rows of the call, bit for bit (the kernel's header says how); `reference` is the
same arithmetic in PyTorch, equal to it within fp32 rounding (its sums run in another
order).
"""

from __future__ import annotations

import ctypes

import torch

from specc.kernels.cpu.build import NATIVE, load_library

BLOCK = 32        # inputs per block (one sub-scale and sub-min)
GROUP = 8         # blocks per group (one fp16 scale and min per feature)
TILE = 16         # output features interleaved per tile
BITS = (4, 6, 8)
SUB_SCALES = 255  # sub-scales are 0..255
SUB_MINS = 127    # sub-mins are -127..127
LINE = 64
LIBRARY = NATIVE


def fits(weight_shape: torch.Size | tuple[int, int]) -> bool:
    out_features, in_features = weight_shape
    return out_features % TILE == 0 and in_features % BLOCK == 0


def group_sizes(in_features: int) -> list[int]:
    """Blocks per group along `in_features` inputs: groups of `GROUP`, the last one shorter."""
    blocks = in_features // BLOCK
    return [min(GROUP, blocks - first) for first in range(0, blocks, GROUP)]


def header_bytes(blocks: int) -> int:
    """A group's fp16 scales and mins, then its sub-scales and sub-mins, padded to a cache line."""
    return 4 * TILE + -(-2 * TILE * blocks // LINE) * LINE


def block_value_bytes(bits: int) -> int:
    return TILE * BLOCK * bits // 8


def tile_bytes(in_features: int, bits: int) -> int:
    """Bytes of one tile of 16 output features over `in_features` inputs."""
    return sum(header_bytes(n) + n * block_value_bytes(bits) for n in group_sizes(in_features))


def pack_blocked(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """A floating `[out, in]` weight as the kernel's uint8 tiles `[out / 16, tile_bytes(in, bits)]`."""
    out_features, in_features = weight.shape
    blocks, tiles, levels = in_features // BLOCK, out_features // TILE, (1 << bits) - 1
    grouped = weight.detach().float().reshape(out_features, blocks, BLOCK)
    parts, first = [], 0
    for size in group_sizes(in_features):
        parts.append(_pack_group(grouped[:, first:first + size], tiles, levels, bits))
        first += size
    return torch.cat(parts, dim=1).contiguous()


def _pack_group(grouped: torch.Tensor, tiles: int, levels: int, bits: int) -> torch.Tensor:
    """One group's bytes per tile: its two-level scales and mins, then its blocks' values. Mins
    round to their nearest sub-min (a lower value is at most half a sub-min step below level 0)
    and scales up, so each block's grid reaches its largest value. Rounding mins down instead
    shifted a 4-bit GGUF's own grid by up to a step: SmolLM2's Q4_1 weights lost 2.2 points of
    top-1 agreement that way, against 0.4 with nearest mins."""
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    min_scale = _fp16_scale(low.abs().amax(dim=1) / SUB_MINS)
    sub_mins = torch.round(low / _nonzero(min_scale)[:, None]).clamp(-SUB_MINS, SUB_MINS)
    mins = min_scale.float()[:, None] * sub_mins
    span = (high - mins).clamp(min=0) / levels
    scale = _fp16_scale(span.amax(dim=1) / SUB_SCALES)
    sub_scales = torch.ceil(span / _nonzero(scale)[:, None]).clamp(0, SUB_SCALES)
    scales = scale.float()[:, None] * sub_scales
    q = torch.round((grouped - mins[..., None]) / _nonzero(scales)[..., None]).clamp(0, levels).to(torch.uint8)
    size = grouped.shape[1]
    values = _pack_values(q.reshape(tiles, TILE, size, 8, 4).permute(0, 2, 3, 1, 4), bits)
    header = torch.cat([_per_tile(scale, tiles), _per_tile(min_scale, tiles),
                        _per_tile(sub_scales.to(torch.uint8), tiles), _per_tile(sub_mins.to(torch.int8), tiles)], dim=1)
    padding = header.new_zeros(tiles, header_bytes(size) - header.shape[1])
    return torch.cat([header, padding, values.reshape(tiles, -1)], dim=1)


def _pack_values(chunks: torch.Tensor, bits: int) -> torch.Tensor:
    """`[tiles, blocks, 8 chunks, 16 features, 4 inputs]` values as each block's bytes: at 4
    bits chunk c in the low nibbles and c + 4 in the high ones; at 6 those low 4 bits, then
    the top 2 bits of chunk 4 h + s at bits 2 s of the h-th 64 bytes."""
    if bits == 8:
        return chunks
    low = chunks & 0x0F
    nibbles = low[:, :, :4] | (low[:, :, 4:] << 4)
    if bits == 4:
        return nibbles.flatten(2)
    top = chunks >> 4
    top = top[:, :, 0::4] | (top[:, :, 1::4] << 2) | (top[:, :, 2::4] << 4) | (top[:, :, 3::4] << 6)
    return torch.cat([nibbles.flatten(2), top.flatten(2)], dim=2)


def _fp16_scale(values: torch.Tensor) -> torch.Tensor:
    """`values` rounded up to fp16, so that no sub-scale or sub-min has to exceed its range."""
    values = values.clamp(max=torch.finfo(torch.float16).max)
    rounded = values.to(torch.float16)
    return torch.where(rounded.float() < values, torch.nextafter(rounded, torch.full_like(rounded, torch.inf)), rounded)


def _nonzero(scale: torch.Tensor) -> torch.Tensor:
    scale = scale.float()
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _per_tile(values: torch.Tensor, tiles: int) -> torch.Tensor:
    """`[out]` or `[out, blocks]` as bytes per tile, block-major: each block's 16 features together."""
    shaped = values.reshape(tiles, TILE, -1).transpose(1, 2).contiguous()
    return shaped.view(torch.uint8).reshape(tiles, -1)


def unpack_blocked(packed: torch.Tensor, bits: int, out_features: int) -> tuple[torch.Tensor, ...]:
    """(q `[out, in / 32, 32]` uint8, scales and mins `[out, in / 32]` float32) of `pack_blocked`."""
    tiles, nbytes = packed.shape
    in_features = inputs_of(packed, bits)
    qs, scales, mins, offset = [], [], [], 0
    for size in group_sizes(in_features):
        group = packed[:, offset:offset + header_bytes(size) + size * block_value_bytes(bits)]
        scale, min_scale = (_from_tile(group[:, at:at + 2 * TILE], torch.float16, 1) for at in (0, 2 * TILE))
        sub_scales = _from_tile(group[:, 4 * TILE:(4 + size) * TILE], torch.uint8, size)
        sub_mins = _from_tile(group[:, (4 + size) * TILE:(4 + 2 * size) * TILE], torch.int8, size)
        scales.append(scale.float() * sub_scales.float())
        mins.append(min_scale.float() * sub_mins.float())
        qs.append(_values(group[:, header_bytes(size):], bits, size, out_features))
        offset += group.shape[1]
    return torch.cat(qs, dim=1), torch.cat(scales, dim=1), torch.cat(mins, dim=1)


def _from_tile(raw: torch.Tensor, dtype: torch.dtype, blocks: int) -> torch.Tensor:
    """The inverse of `_per_tile`: `[out, blocks]`."""
    tiles = raw.shape[0]
    values = raw.contiguous().view(dtype).reshape(tiles, blocks, TILE)
    return values.transpose(1, 2).reshape(tiles * TILE, blocks)


def _values(raw: torch.Tensor, bits: int, blocks: int, out_features: int) -> torch.Tensor:
    tiles = raw.shape[0]
    values = raw.reshape(tiles, blocks, -1)
    if bits in (4, 6):
        nibbles = values[..., :4 * 64].reshape(tiles, blocks, 4, TILE, 4)
        low = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2)
        if bits == 6:
            top = values[..., 4 * 64:].reshape(tiles, blocks, 2, 1, TILE, 4)
            top = torch.cat([(top >> (2 * s)) & 3 for s in range(4)], dim=3).reshape(tiles, blocks, 8, TILE, 4)
            low = low | (top << 4)
        values = low
    chunks = values.reshape(tiles, blocks, 8, TILE, 4).permute(0, 3, 1, 2, 4)
    return chunks.reshape(out_features, blocks, BLOCK)


def inputs_of(packed: torch.Tensor, bits: int) -> int:
    """The input features a `[tiles, bytes]` weight packed at `bits` maps, else a ValueError."""
    nbytes = packed.shape[-1]
    in_features = BLOCK
    while tile_bytes(in_features, bits) < nbytes:
        in_features += BLOCK
    if tile_bytes(in_features, bits) != nbytes:
        raise ValueError(f"{nbytes} bytes per tile are no whole number of {bits}-bit blocks")
    return in_features


def reference(rows: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int) -> torch.Tensor:
    """The kernel's arithmetic in PyTorch, fp32 (the kernel rounds its output to bfloat16)."""
    q, scales, mins = unpack_blocked(packed, bits, out_features)
    x = rows.float().reshape(rows.shape[0], -1, BLOCK)
    a_scales = x.abs().amax(dim=-1) / 127
    qa = torch.round(x / torch.where(a_scales > 0, a_scales, torch.ones_like(a_scales))[..., None])
    weight = q.float() * scales.float()[..., None] + mins.float()[..., None]
    return (qa * a_scales[..., None]).reshape(rows.shape[0], -1) @ weight.reshape(out_features, -1).T


def vectorized() -> bool:
    """Whether this machine's build runs a vector path, AVX-512 VNNI or AVX2 (else the portable scalar one)."""
    return bool(load_library(LIBRARY).specc_blocked_matmul_vectorized())


def check_inputs(rows: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int) -> None:
    if rows.device.type != "cpu" or packed.device.type != "cpu":
        raise ValueError(f"blocked_matmul runs on the CPU, got rows on {rows.device} and weights on {packed.device}")
    if rows.dim() != 2 or rows.dtype != torch.bfloat16:
        raise ValueError(f"blocked_matmul takes bfloat16 rows [n, in], got {rows.dtype} {list(rows.shape)}")
    if packed.dim() == 3:
        raise ValueError(OLD_LAYOUT)
    if bits not in BITS or packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"blocked_matmul takes a uint8 weight [out/16, bytes per tile] of 4, 6 or 8 bits, got "
                         f"{packed.dtype} {list(packed.shape)} at {bits} bits")
    tiles, nbytes = packed.shape
    if tiles * TILE != out_features or rows.shape[1] % BLOCK or nbytes != tile_bytes(rows.shape[1], bits):
        raise ValueError(f"blocked_matmul: a weight of {tiles} tiles x {nbytes} bytes does not "
                         f"map {rows.shape[1]} inputs to {out_features} outputs at {bits} bits")


OLD_LAYOUT = ("blocked_matmul: this weight is in the layout of specc before 2026-11-30 (an fp16 scale and min per "
              "block, [out/16, in/32, bytes]); recompile the engine with this specc")


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
    """The kernel's portable path, forced (what a CPU with neither AVX-512 VNNI nor AVX2 runs): for tests."""
    return _run(rows, packed, bits, out_features, scalar=True)
