"""The calls into specc's CPU operators (quantized matmul, row attention, decoder chain), timed by the
kernels themselves while `calls_traced` is active (`cpu/call_trace.cpp`): for profiling
where a decode step's time goes, in the kernels, between them and outside the graph.
Timestamps are on the clock `time.perf_counter_ns` reads (Linux's monotonic clock)."""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from dataclasses import dataclass

from specc.kernels.cpu.build import NATIVE, load_library

KINDS = {1: "matmul", 2: "attention", 3: "chain"}


@dataclass(frozen=True)
class TracedCall:
    start_ns: int
    end_ns: int
    kind: str   # "matmul", "attention" or "chain"


@contextmanager
def calls_traced():
    """Record every call into the operators while the block runs (forgetting earlier ones)."""
    library = load_library(NATIVE)
    library.specc_trace_calls(1)
    try:
        yield
    finally:
        library.specc_trace_calls(0)


def traced_calls(last: int | None = None) -> list[TracedCall]:
    """The calls recorded since tracing last started (the last `last`, or all the ring holds), oldest first."""
    library = load_library(NATIVE)
    library.specc_traced_count.restype = ctypes.c_longlong
    library.specc_traced_calls.restype = ctypes.c_longlong
    wanted = library.specc_traced_count() if last is None else last
    buffer = (ctypes.c_longlong * (3 * max(wanted, 1)))()
    got = library.specc_traced_calls(buffer, ctypes.c_longlong(wanted))
    return [TracedCall(buffer[3 * i], buffer[3 * i + 1], KINDS[buffer[3 * i + 2]]) for i in range(got)]
