"""Quantization schemes of the target's linear weights, and the CPU kernels that read them.

* ``q4``: 4-bit weights in blocks of 32 inputs with a scale and min each (GGUF
  Q4_1's arithmetic), stored as 8-bit sub-scales of an fp16 scale and min per 8
  blocks (GGUF's k-quant super-blocks): 4.625 bits a weight. Activations are
  quantized per row and block to int8 (llama.cpp's Q8_0); specc's own kernel
  computes it (``torch.ops.specc.blocked_matmul``, AVX-512 VNNI or AVX2; compiled on first
  use). The LM head takes ``q8``, or ``q6`` where the GGUF it came from stores it in
  6 bits or fewer (llama.cpp's Q4_K_M keeps it at Q6_K; `head_bits_for`). A weight
  whose shape the kernel's tiles do not fit (outputs a multiple of 16, inputs of
  32) falls back to ``int8``.
* ``q6`` and ``q8``: the same with 6- and 8-bit weights (the LM head in ``q8``).

The weight-only schemes PyTorch ships CPU kernels for (activations in bfloat16):

* ``int8``: symmetric, one scale per output channel, ``aten._weight_int8pack_mm``.
* ``int4``: asymmetric min/max per group of 32 input features (the blocks of
  GGUF's 4-bit types, so a 4-bit GGUF is re-packed at its own granularity;
  ``int4-g64`` … ``int4-g256`` choose coarser groups, faster and less exact),
  ``aten._weight_int4pack_mm_for_cpu``, which computes ``w = (q - 8) * scale +
  zero`` with ``q`` in 0..15. A weight whose input features the group does not
  divide takes the largest smaller group that does (SmolLM2's 576 under
  int4-g128: groups of 64); one whose output features are not a multiple of 16
  (or that no group fits) falls back to ``int8``. The LM head keeps 8 bits under
  int4, as llama.cpp's Q4_K_M keeps it at 6: a tied head is the embedding table,
  which 4-bit GGUFs store in 6 or 8 bits (what it costs: docs/quantization.md#measured).

Under the weight-only schemes activations stay in the engine's dtype, and scales and
zeros are stored in it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from specc.errors import UsageError
from specc.kernels import blocked_matmul as blocked

aten = torch.ops.aten

INT4_GROUPS = (32, 64, 128, 256)
DEFAULT_INT4_GROUP = 32   # GGUF's 4-bit blocks (Q4_0, Q4_1, Q4_K's sub-blocks) hold 32 weights
BLOCKED = "blocked"   # specc's kernel: weights in blocks of 32, activations in int8
WEIGHT_ONLY = "aten"  # PyTorch's weight-only kernels
SCHEMES = ("q4", "q6", "q8", "int8", "int4", *(f"int4-g{g}" for g in INT4_GROUPS))
INT4_ROWS_MULTIPLE = 16   # output features per block of the CPU int4 packing
INT4_INNER_K_TILES = 1    # the CPU packing's only layout: two 4-bit values per byte


@dataclass(frozen=True)
class Scheme:
    """A quantization scheme: `bits` 8 or 4, `group` input features per scale (None: per
    channel), and the `kernel` reading it (`WEIGHT_ONLY` or `BLOCKED`)."""

    bits: int
    group: int | None = None
    kernel: str = WEIGHT_ONLY
    head_bits: int | None = None   # a blocked scheme's LM head, where not q8

    @property
    def name(self) -> str:
        if self.kernel == BLOCKED:
            return f"q{self.bits}"
        return "int8" if self.bits == 8 else f"int4-g{self.group}"

    @property
    def quantizes_activations(self) -> bool:
        return self.kernel == BLOCKED

    def fits(self, weight: torch.Tensor) -> bool:
        out_features, in_features = weight.shape
        if self.kernel == BLOCKED:
            return blocked.fits(weight.shape)
        return self.bits == 8 or (in_features % self.group == 0 and out_features % INT4_ROWS_MULTIPLE == 0)

    def pack(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The tensors the matmul reads, from a floating `[out, in]` weight."""
        if self.kernel == BLOCKED:
            return {"blocks": blocked.pack_blocked(weight, self.bits)}
        return pack_int8(weight) if self.bits == 8 else pack_int4(weight, self.group)

    def dequantize(self, weight: torch.Tensor) -> torch.Tensor:
        """The floating `[out, in]` weight the matmul computes with after `pack`, in `weight`'s dtype."""
        if self.kernel == BLOCKED:
            q, scales, mins = blocked.unpack_blocked(self.pack(weight)["blocks"], self.bits, weight.shape[0])
            rounded = q.float() * scales.float()[..., None] + mins.float()[..., None]
        elif self.bits == 8:
            packed = pack_int8(weight)
            rounded = packed["qweight"].float() * packed["scales"].float()[:, None]
        else:
            q, scales, zeros = (t.to(weight.dtype).float() for t in _int4_levels(weight, self.group))
            rounded = (q - 8) * scales[..., None] + zeros[..., None]
        return rounded.reshape(weight.shape).to(weight.dtype)

    def matmul(self, rows: torch.Tensor, packed: dict[str, torch.Tensor]) -> torch.Tensor:
        """`rows [n, in]` (contiguous) times the weight's transpose: `[n, out]`."""
        if self.kernel == BLOCKED:
            return blocked.blocked_matmul(rows, packed["blocks"], self.bits, packed["blocks"].shape[0] * blocked.TILE)
        if self.bits == 8:
            return aten._weight_int8pack_mm(rows, packed["qweight"], packed["scales"])
        return aten._weight_int4pack_mm_for_cpu(rows, packed["qweight"], self.group, packed["scales_and_zeros"])

    def call_args(self, rows, packed: dict, out_features: int) -> tuple:
        """`(op, args)` of `matmul` for a graph, `packed` holding graph nodes."""
        if self.kernel == BLOCKED:
            return torch.ops.specc.blocked_matmul.default, (rows, packed["blocks"], self.bits, out_features)
        if self.bits == 8:
            return aten._weight_int8pack_mm.default, (rows, packed["qweight"], packed["scales"])
        return aten._weight_int4pack_mm_for_cpu.default, (rows, packed["qweight"], self.group,
                                                          packed["scales_and_zeros"])

    def to_json(self) -> dict:
        if self.kernel == BLOCKED:
            return {"scheme": self.name, "bits": self.bits,
                    "granularity": "blocks of 32 inputs (8-bit scale and min under an fp16 pair per 8 blocks)",
                    "activations": "int8, per row and block of 32", "kernel": "specc.blocked_matmul"}
        return {"scheme": self.name, "bits": self.bits,
                "granularity": "per output channel" if self.group is None else f"groups of {self.group} inputs"}


INT8 = Scheme(8)
Q4 = Scheme(4, blocked.BLOCK, BLOCKED)
Q6 = Scheme(6, blocked.BLOCK, BLOCKED)
Q8 = Scheme(8, blocked.BLOCK, BLOCKED)
# GGUF types of 6 bits a weight or fewer: a head stored in one loses nothing more at q6 than at q8
# beyond the re-rounding both do.
SIX_BIT_OR_FEWER = {"Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K"}


def head_bits_for(scheme: Scheme, source_head_type: str | None) -> Scheme:
    """`scheme` with its LM head at 6 bits where it is `q4` and the GGUF the checkpoint was
    converted from stored the head in 6 bits or fewer (a head from Q8_0, F16 or a Hugging Face
    checkpoint keeps q8: at 6 bits SmolLM2's Q8_0 head cost 2.4 points of top-1 agreement)."""
    if scheme.kernel == BLOCKED and scheme.bits == 4 and source_head_type in SIX_BIT_OR_FEWER:
        return replace(scheme, head_bits=6)
    return scheme


def parse_scheme(text: str) -> Scheme:
    """`q4`, `q6`, `q8`, `int8`, `int4` or `int4-gN` (N one of `INT4_GROUPS`), else a `UsageError` listing them."""
    named = {"q4": Q4, "q6": Q6, "q8": Q8, "int8": INT8}
    if text in named:
        return named[text]
    match = re.fullmatch(r"int4(?:-g(\d+))?", text)
    group = int(match.group(1) or DEFAULT_INT4_GROUP) if match else None
    if group not in INT4_GROUPS:
        raise UsageError(f"unknown quantization {text!r}; choose from: {', '.join(SCHEMES)}")
    return Scheme(4, group)


def scheme_for(scheme: Scheme, weight: torch.Tensor, logits: bool = False) -> Scheme:
    """`scheme`, or int4 in the largest smaller group that fits `weight`'s shape, or int8
    (always int8 for the weight computing the `logits`; under a blocked scheme its `head_bits`
    or else `q8`, where it fits)."""
    if scheme.kernel == BLOCKED:
        head = Scheme(scheme.head_bits, blocked.BLOCK, BLOCKED) if scheme.head_bits else Q8
        chosen = head if logits else scheme
        return chosen if chosen.fits(weight) else INT8
    if scheme.bits == 8 or logits:
        return INT8
    smaller = [Scheme(4, group) for group in reversed(INT4_GROUPS) if group <= scheme.group]
    return next((candidate for candidate in smaller if candidate.fits(weight)), INT8)


def pack_int8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    qweight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return {"qweight": qweight, "scales": scales.to(weight.dtype)}


def pack_int4(weight: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    out_features, in_features = weight.shape
    q, scales, zeros = _int4_levels(weight, group)
    qweight = aten._convert_weight_to_int4pack_for_cpu(q.reshape(out_features, in_features), INT4_INNER_K_TILES)
    scales_and_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()
    return {"qweight": qweight, "scales_and_zeros": scales_and_zeros.to(weight.dtype)}


def _int4_levels(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q `[out, in / group, group]` int32 in 0..15, scales and zeros `[out, in / group]` fp32)."""
    out_features, in_features = weight.shape
    w = weight.detach().float().reshape(out_features, in_features // group, group)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.int32)
    return q, scales, low + 8 * scales   # the kernel subtracts 8 from every q


def packed_bytes(packed: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in packed.values())
