"""The dtype compile-time training runs in: whichever of the engine's dtype and float32
multiplies the model's matrices faster on this machine, measured once per process.

Why measure: eager reduced-precision matrix products are several times slower than
float32 on CPUs without bfloat16 matrix units (AVX-512 BF16 but no AMX), and several
times faster on CPUs with them (AMX); measurements:
benchmarks/NOTES.md#training-in-bfloat16-compiles-the-dtype-is-probed-issue-35. Training in
float32 casts the trained parameters to the engine's dtype when they are installed.
"""

from __future__ import annotations

import time

import torch

PROBE_ROWS = 128      # a training window's tokens
PROBE_REPEATS = 5

_measured: dict[tuple, dict[str, float]] = {}


def training_dtype(engine_dtype: str, hidden_size: int, device: torch.device | str = "cpu") -> str:
    """float32 engines train in float32; a reduced-precision engine trains in its own dtype
    unless float32 matrix products are faster on `device` (`matmul_seconds`)."""
    if engine_dtype == "float32":
        return "float32"
    seconds = matmul_seconds((engine_dtype, "float32"), hidden_size, device)
    return engine_dtype if seconds[engine_dtype] <= seconds["float32"] else "float32"


def matmul_seconds(dtypes: tuple[str, ...], hidden_size: int, device: torch.device | str = "cpu") -> dict[str, float]:
    """Best-of-`PROBE_REPEATS` seconds of a [128, hidden] x [hidden, 4 hidden] product (an MLP
    projection over one window) per dtype on `device`, at the current thread count; memoised."""
    device = torch.device(device)
    key = (dtypes, hidden_size, torch.get_num_threads(), str(device))
    if key not in _measured:
        _measured[key] = {name: _time_matmul(getattr(torch, name), hidden_size, device) for name in dtypes}
    return _measured[key]


def _time_matmul(dtype: torch.dtype, hidden: int, device: torch.device = torch.device("cpu")) -> float:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(PROBE_ROWS, hidden, generator=generator).to(device, dtype)
    b = torch.randn(hidden, 4 * hidden, generator=generator).to(device, dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        _synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
