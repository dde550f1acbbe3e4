"""A small graph of specc's CPU operators, for the packaging tests."""

from __future__ import annotations

import torch

from specc.kernels import blocked_matmul, row_attention  # noqa: F401  (define torch.ops.specc.*)
from specc.kernels.blocked_matmul import pack_blocked


class QuantizedLayer(torch.nn.Module):
    """A quantized projection, then attention over cache rows with the default and an explicit scale."""

    def __init__(self, heads: int = 2, dim: int = 32):
        super().__init__()
        self.heads, self.dim = heads, dim
        weight = torch.randn(heads * dim, 64, generator=torch.Generator().manual_seed(0))
        self.register_buffer("packed", pack_blocked(weight, 4))

    def forward(self, x, keys, values, mask):
        query = torch.ops.specc.blocked_matmul(x, self.packed, 4, self.heads * self.dim)
        query = query.reshape(1, x.shape[0], self.heads, self.dim).transpose(1, 2)
        default = torch.ops.specc.row_attention(query, keys, values, mask)
        scaled = torch.ops.specc.row_attention(query, keys, values, mask, 0.5)
        return default + scaled


def example_inputs(rows: int = 3, kv: int = 20):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 64, generator=generator).bfloat16()
    keys, values = (torch.randn(1, 1, kv, 32, generator=generator).bfloat16() for _ in range(2))
    mask = torch.ones(1, 1, rows, kv, dtype=torch.bool).tril(kv - rows)
    return x, keys, values, mask
