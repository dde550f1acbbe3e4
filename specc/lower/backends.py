"""The three backends: eager (the rewritten graph itself), Inductor, AOTInductor.

Inputs of every decoding graph: input_ids [1, q], position_ids [1, q],
attn_mask [1, 1, q, kv], cache_positions [q], then the caches. q and kv
are dynamic; the caches are static, one slot longer than max_seq_len.
Method graphs may add inputs after those; the AOTInductor packager knows
the layer-exit input [1, q, hidden] that `expose_layer_exit` adds
(Kangaroo's stored exit states), whatever it is named.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

import torch
import torch.fx as fx

from specc.capture.families import ArchitectureSummary
from specc.errors import SpeccError
from specc.methods.infrastructure import DECODING_INPUTS
from specc.passes.expose_layer_exit import EXIT_ROLE


CACHE_INPUT = re.compile(r"[kv]_cache_\w+")


def lower_eager(gm: fx.GraphModule) -> Callable:
    return gm


def lower_inductor(gm: fx.GraphModule) -> Callable:
    # Inductor compiles lazily, on the first call per shape family (q = 1 and q > 1).
    return torch.compile(gm, dynamic=True, fullgraph=True)


def package_aoti(gm: fx.GraphModule, architecture: ArchitectureSummary, dtype: torch.dtype, max_seq_len: int,
                 package_path: Path) -> float:
    """Export the rewritten graph with dynamic q/kv and package it; returns seconds."""
    start = time.perf_counter()
    example, dynamic = _example_inputs(gm, architecture, dtype, max_seq_len)
    try:
        exported = torch.export.export(gm, example, dynamic_shapes=dynamic, strict=False)
        torch._inductor.aoti_compile_and_package(exported, package_path=str(package_path))
    except Exception as exc:
        raise SpeccError(f"AOTInductor packaging failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    return time.perf_counter() - start


def load_aoti(package_path: Path) -> Callable:
    return torch._inductor.aoti_load_package(str(package_path))


def _example_inputs(gm: fx.GraphModule, arch: ArchitectureSummary, dtype: torch.dtype, max_seq_len: int):
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = [n.target for n in inputs]
    if tuple(names[:4]) != DECODING_INPUTS:
        raise SpeccError(f"graph inputs {names[:4]} are not the decoding layout {list(DECODING_INPUTS)}")
    q = torch.export.Dim("q", min=1, max=max_seq_len)
    kv = torch.export.Dim("kv", min=1, max=max_seq_len)
    q_len, kv_len = 3, 5
    example = [
        torch.zeros(1, q_len, dtype=torch.long),
        torch.arange(2, 2 + q_len)[None],
        torch.ones(1, 1, q_len, kv_len, dtype=torch.bool),
        torch.arange(2, 2 + q_len),
    ]
    dynamic = [{1: q}, {1: q}, {2: q, 3: kv}, {0: q}]
    cache_shape = (1, arch.num_key_value_heads, max_seq_len + 1, arch.head_dim)
    for node in inputs[4:]:
        if CACHE_INPUT.fullmatch(node.target):
            example.append(torch.zeros(cache_shape, dtype=dtype))
            dynamic.append(None)
        elif node.meta.get("specc_role") == EXIT_ROLE:
            example.append(torch.zeros(1, q_len, arch.hidden_size, dtype=dtype))
            dynamic.append({1: q})
        else:
            raise SpeccError(f"AOTInductor cannot package graph input {node.target!r}: the packager knows the "
                             f"decoding inputs, k/v caches and layer-exit states; use --backend eager or inductor")
    return tuple(example), tuple(dynamic)
