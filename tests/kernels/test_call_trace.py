"""specc's CPU operators time their own calls while tracing is on, and only then."""

from __future__ import annotations

import time

import torch

from specc.kernels.blocked_matmul import pack_blocked
from specc.kernels.call_trace import calls_traced, traced_calls


def test_calls_are_recorded_in_order_while_traced_and_only_then():
    rows = torch.randn(2, 64).bfloat16()
    packed = pack_blocked(torch.randn(32, 64), 4)
    query, key, value = (torch.randn(1, 2, 3, 16).bfloat16() for _ in range(3))
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    torch.ops.specc.blocked_matmul(rows, packed, 4, 32)   # loads the library: untraced
    with calls_traced():
        before = time.perf_counter_ns()
        torch.ops.specc.blocked_matmul(rows, packed, 4, 32)
        torch.ops.specc.row_attention(query, key, value, mask)
        torch.ops.specc.blocked_matmul(rows, packed, 4, 32)
        after = time.perf_counter_ns()
    calls = traced_calls()
    assert [call.kind for call in calls] == ["matmul", "attention", "matmul"]
    moments = [before] + [t for call in calls for t in (call.start_ns, call.end_ns)] + [after]
    assert moments == sorted(moments)
    torch.ops.specc.blocked_matmul(rows, packed, 4, 32)
    assert traced_calls() == calls
    assert traced_calls(last=1) == calls[-1:]
