"""The memory-bandwidth bound on plain decoding, measured on this machine.

Decoding one token with batch 1 reads every weight once, so no `none`
engine decodes faster than (bytes read per second) / (weight bytes per
token). The read rate is timed here as torch's sum over a float32 buffer
far larger than the caches, with the threads the benchmark uses; the best of
a few passes is kept, since a bound should be what the memory can do, not
what a busy moment allowed. Weight bytes count every parameter once (a tied
embedding and LM head read one matrix) at the engine's dtype; activations
and the KV cache are left out, so the bound is slightly optimistic.
"""

from __future__ import annotations

import time

import torch

BUFFER_BYTES = 512 * 2**20
PASSES = 5


def read_bandwidth(buffer_bytes: int = BUFFER_BYTES, passes: int = PASSES) -> float:
    """Bytes per second one torch reduction reads (best of `passes`)."""
    buffer = torch.ones(buffer_bytes // 4, dtype=torch.float32)
    buffer.sum()   # touch every page before timing
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best


def decode_bound(parameters: int, dtype: str, bandwidth: float) -> dict:
    """Weight bytes per token at `dtype` and the tokens per second they allow."""
    weight_bytes = parameters * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return {"weight_bytes_per_token": weight_bytes, "read_bytes_per_second": round(bandwidth),
            "bound_tokens_per_second": bandwidth / weight_bytes,
            "measured_by": f"best of {PASSES} torch sums over a {BUFFER_BYTES // 2**20} MiB float32 buffer, "
                           f"{torch.get_num_threads()} thread(s)"}
