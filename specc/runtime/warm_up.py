"""Warming up lazily compiling backends without baking in accidental shapes.

A compiler that treats every dimension as dynamic ties together dimensions
that happen to be equal on the first call (duck sizing) and specializes on
that equality, recompiling at the first real call that breaks it. Warm-up
calls therefore use lengths that equal no static size of the graph, and
q != kv != r. It also specializes sizes of 1, so a graph that selects logit
rows is warmed up for a prompt chunk asking for its last row's logits too.
"""

from __future__ import annotations

from typing import Callable

import torch

from specc.graph.signature import LOGIT_ROWS_DIM, example_inputs


def untaken_size(taken: set[int], at_least: int) -> int:
    """The smallest size >= `at_least` that is not in `taken`."""
    return next(n for n in range(at_least, at_least + len(taken) + 1) if n not in taken)


def warm_up(forward: Callable, target) -> None:
    """Trigger the compilations of a lowered graph (`target`: its `LoweringTarget`) once,
    for a chunk, for a single token and, where the graph selects logit rows, for a chunk's
    last row, on throw-away inputs built from its signature."""
    taken = set(target.sizes.values())
    chunk = untaken_size(taken, 7)
    chunk_kv = untaken_size(taken | {chunk}, chunk + 6)
    step_kv = untaken_size(taken | {chunk, chunk_kv}, chunk_kv + 5)
    rows = untaken_size(taken | {chunk, chunk_kv, step_kv}, 2)
    calls = [(chunk, chunk_kv, rows), (1, step_kv, 1)]
    if any(LOGIT_ROWS_DIM in spec.shape for spec in target.signature.inputs):
        calls.append((chunk, chunk_kv, 1))
    with torch.inference_mode():
        for q, kv, r in calls:
            forward(*example_inputs(target.signature, target.sizes, target.dtype, q=q, kv=kv, r=r,
                                    device=target.device))
