"""`torch.ops.specc.row_argmax(scores)`: the greedy choice over each row, as `scores.argmax(-1)`.

Scores `[n]` or `[rows, n]`, float32 or bfloat16; the index of each row's largest value,
the first among equals, and a row's first NaN where it holds one (torch.argmax's rule).
Its CPU implementation is C++ (`cpu/row_argmax.cpp`), registered when specc's CPU library
loads, which a quantized engine does; torch's own argmax over a bfloat16 vocabulary row
took several times that kernel's time. Until then, and on other devices, torch's argmax
computes it, over float32 on the CPU (exact, and faster there than over bfloat16): the
op never builds the library itself, so an engine without specc's kernels needs no compiler.
"""

from __future__ import annotations

import torch

torch.library.define("specc::row_argmax", "(Tensor scores) -> Tensor")


@torch.library.impl("specc::row_argmax", "CompositeExplicitAutograd")
def _row_argmax_by_torch(scores: torch.Tensor) -> torch.Tensor:
    reduced = scores.device.type == "cpu" and scores.dtype in (torch.bfloat16, torch.float16)
    return (scores.float() if reduced else scores).argmax(dim=-1)


@torch.library.register_fake("specc::row_argmax")
def _row_argmax_fake(scores: torch.Tensor) -> torch.Tensor:
    return scores.new_empty(scores.shape[:-1], dtype=torch.int64)


def greedy_tokens(scores: torch.Tensor) -> torch.Tensor:
    """`scores.argmax(-1)`, by the fastest implementation loaded."""
    return torch.ops.specc.row_argmax.default(scores)
