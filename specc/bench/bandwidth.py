"""The memory-bandwidth bound on plain decoding, measured on this machine.

Decoding one token with batch 1 reads every weight once, so no `none`
engine decodes faster than (bytes read per second) / (weight bytes per
token). The read rate is timed as torch's sum over a float32 buffer far
larger than the caches, with the threads the benchmark uses.

On a shared (virtual) machine what the memory delivers drifts by tens of
percent over minutes (seen here: 30 to 53 GB/s on the same two cores), and
the first passes after a pause read slower while the thread pool and the
clocks wake up. So one reading is no bound: the benchmark takes a sample
between its repeats (`BandwidthSamples`), each a warm-up followed by the best
of a few passes, and reports the median with the range. The bytes a step
reads are those of every tensor the `none` engine's target graph holds, as
it holds them (a quantized engine's packed weights with their scales), each
once (a tied embedding and LM head read one matrix), except a table the
graph only looks rows up in (an embedding whose LM head is a separate or
quantized copy: a step reads one row of it). A step also reads the keys and
values of every position it attends to, in every layer: where the benchmark
knows the prompts' lengths and what was generated, the bound counts those
too, at the mean number of positions a decode step attended to
(`kv_cache_bytes_per_token`; the weights-only figure stays beside it).
Activations are left out, so the bound is still slightly optimistic.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.fx as fx

from specc.graph.nodes import attribute
from specc.graph.signature import CACHE_ROLE

BUFFER_BYTES = 256 * 2**20
PASSES = 5
WARMUP_SECONDS = 0.2


def read_bandwidth(buffer_bytes: int = BUFFER_BYTES, passes: int = PASSES,
                   warmup_seconds: float = WARMUP_SECONDS) -> float:
    """Bytes per second one torch reduction reads: the best of `passes` after a warm-up."""
    buffer = torch.ones(buffer_bytes // 4, dtype=torch.float32)
    warm_until = time.perf_counter() + warmup_seconds
    buffer.sum()   # touch every page before timing
    while time.perf_counter() < warm_until:
        buffer.sum()
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best


class BandwidthSamples:
    """Read rates sampled over a benchmark (call it between repeats), summarised as median and range."""

    def __init__(self, read=read_bandwidth):
        self._read = read
        self.values: list[float] = []

    def __call__(self) -> None:
        self.values.append(self._read())

    def bound(self, weight_bytes: int, kv_cache_bytes: float = 0.0) -> dict:
        if not self.values:
            self()
        return decode_bound(weight_bytes, self.values, kv_cache_bytes)


ROW_LOOKUPS = (torch.ops.aten.embedding.default,)


def decode_read_bytes(gm: fx.GraphModule) -> int:
    """Bytes of the tensors one decode step of graph `gm` reads (see the module docstring)."""
    read, looked_up = {}, {}
    for tensor, users in _held_tensors(gm):
        kept = looked_up if all(user.target in ROW_LOOKUPS for user in users) else read
        kept[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(read.values())


def _held_tensors(gm: fx.GraphModule):
    """(tensor, the nodes that use it) for every get_attr of `gm` and its called submodules."""
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            yield attribute(gm, node.target), list(node.users)
        elif node.op == "call_module":
            yield from _held_tensors(gm.get_submodule(node.target))


def decode_bound(weight_bytes: int, samples: list[float], kv_cache_bytes: float = 0.0) -> dict:
    """The tokens per second the median read rate allows a step that reads `weight_bytes` of
    weights and, on average, `kv_cache_bytes` of cached keys and values."""
    median = statistics.median(samples)
    step_bytes = weight_bytes + kv_cache_bytes
    return {"weight_bytes_per_token": weight_bytes, "kv_cache_bytes_per_token": round(kv_cache_bytes),
            "read_bytes_per_second": round(median),
            "read_bytes_per_second_range": [round(min(samples)), round(max(samples))],
            "read_samples": len(samples),
            "bound_tokens_per_second": median / step_bytes,
            "bound_tokens_per_second_range": [min(samples) / step_bytes, max(samples) / step_bytes],
            "weights_only_bound_tokens_per_second": median / weight_bytes,
            "measured_by": f"median of {len(samples)} sample(s) taken between repeats, each the best of "
                           f"{PASSES} torch sums over a {BUFFER_BYTES // 2**20} MiB float32 buffer after a "
                           f"{WARMUP_SECONDS:g} s warm-up, {torch.get_num_threads()} thread(s)"}


def cache_bytes_per_position(context, graph: str) -> int:
    """Bytes one cached position holds for graph `graph` of an engine's `context` (its key and
    value in every layer), which a step that attends to the position reads."""
    caches = len(context.signatures[graph].inputs_with_role(CACHE_ROLE))
    architecture = context.architectures[graph]
    element = torch.empty((), dtype=context.dtype).element_size()
    return caches * architecture.num_key_value_heads * architecture.head_dim * element


def kv_cache_read_bytes(per_position: int, runs: list, system: str, prompt_ids: list[list[int]]) -> float:
    """The mean bytes of cached keys and values one decode step of `system` read over `runs`."""
    generations = [(len(prompt_ids[run.prompt_index]), len(run.token_ids)) for run in runs if run.system == system]
    return per_position * mean_positions_attended(generations)


def mean_positions_attended(generations: list[tuple[int, int]]) -> float:
    """The mean number of cached positions a one-row decode step attends to, over generations
    given as (prompt tokens, new tokens): the prefill gives the first new token, and the step
    that gives new token i (i >= 1) attends to the prompt and the i tokens before it."""
    steps = [prompt + i for prompt, new in generations for i in range(1, new)]
    return statistics.fmean(steps) if steps else 0.0
