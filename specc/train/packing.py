"""Several training windows in one call of a decoding graph.

A teacher pass runs the frozen target once per training window. On a GPU a
window of 128 tokens is far too little work for one call: the pass is bound
by launching the graph's kernels, not by arithmetic (Kangaroo's 776 windows
took 23 s on an H100, eagle's 38 s: benchmarks/NOTES.md#the-second-gpu-check-
where-15-device-minutes-go-issues-32-33). Laid end to end, with positions
restarting at each window and a block-diagonal causal mask, windows are
independent sequences of one call: every row attends to exactly the keys it
would alone. On the CPU the pass is bound by arithmetic and a longer call
adds attention over keys the mask hides, so it packs little
(benchmarks/NOTES.md#packing-the-teachers-windows).
"""

from __future__ import annotations

import torch

# A call's rows keep the vocabulary's logits and softmax in float32: 2,048 rows of a 128K
# vocabulary are 1 GB, which a GPU holds and a CPU need not.
TOKENS_PER_CALL = {"cuda": 2048, "cpu": 256}


def tokens_per_call(device: torch.device | str) -> int:
    """How many tokens of windows one teacher call takes on `device`."""
    return TOKENS_PER_CALL.get(torch.device(device).type, TOKENS_PER_CALL["cpu"])


def window_groups(windows: list[torch.Tensor], budget: int) -> list[list[torch.Tensor]]:
    """Consecutive windows, as many per group as fit in `budget` tokens (a longer window alone)."""
    groups: list[list[torch.Tensor]] = []
    used = budget
    for window in windows:
        if used + window.numel() > budget:
            groups.append([])
            used = 0
        groups[-1].append(window)
        used += window.numel()
    return groups


def packed_decoding_inputs(windows: list[torch.Tensor], sliding_window: int | None) -> tuple:
    """tokens [1, N], positions [1, N] (restarting at each window), a block-diagonal causal
    mask [1, 1, N, N] (within the sliding window) and cache slots 0..N-1, for the windows
    laid end to end."""
    tokens = torch.cat(windows)
    device = tokens.device
    lengths = torch.tensor([w.numel() for w in windows], device=device)
    owner = torch.repeat_interleave(torch.arange(len(windows), device=device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(tokens.numel(), device=device) - starts[owner]
    query, key = positions[:, None], positions[None, :]
    mask = (owner[:, None] == owner[None, :]) & (key <= query)
    if sliding_window is not None:
        mask &= key > query - sliding_window
    return tokens[None], positions[None], mask[None, None], torch.arange(tokens.numel(), device=device)


def unpack(rows: torch.Tensor, windows: list[torch.Tensor], dim: int = 0) -> list[torch.Tensor]:
    """`rows` (N along `dim`) cut into each window's own rows, each a tensor of its own (a
    view would keep the whole call's rows alive)."""
    return [part.clone() for part in rows.split([w.numel() for w in windows], dim=dim)]
