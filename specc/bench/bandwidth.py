"""The memory-bandwidth bound on plain decoding, measured on this machine.

Decoding one token with batch 1 reads every weight once, so no `none`
engine decodes faster than (bytes read per second) / (weight bytes per
token). The read rate is timed as torch's sum over a float32 buffer far
larger than the caches, with the threads the benchmark uses, on huge pages
where the kernel lends them, as engines hold their weights and caches
(`specc.host.huge_pages`), since a buffer on 4 KiB pages reads slower.

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
values of every position it attends to, in every layer (in a sliding-window
layer, the last `window` only): where the benchmark knows the prompts'
lengths and what was generated, the bound counts those too, as the mean over
the measured decode steps (`kv_cache_bytes_per_token`; the weights-only
figure stays beside it).
Activations are left out, so the bound is still slightly optimistic.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.fx as fx

from specc.graph.nodes import ATTENTION_WINDOW, ROW_LOOKUPS, attribute, graph_modules
from specc.graph.signature import CACHE_ROLE
from specc.host.huge_pages import huge_page_bytes, on_huge_pages

BUFFER_BYTES = 256 * 2**20
PASSES = 5
WARMUP_SECONDS = 0.2


def read_bandwidth(buffer_bytes: int = BUFFER_BYTES, passes: int = PASSES,
                   warmup_seconds: float = WARMUP_SECONDS) -> float:
    """Bytes per second one torch reduction reads: the best of `passes` after a warm-up."""
    buffer = on_huge_pages({"buffer": torch.ones(buffer_bytes // 4, dtype=torch.float32)})["buffer"]
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
                           f"{WARMUP_SECONDS:g} s warm-up, {torch.get_num_threads()} thread(s)"
                           f"{', on huge pages' if huge_page_bytes() else ''}"}


@dataclass(frozen=True)
class CacheLayout:
    """What a cached position costs a decode step that attends to it: each layer's key and value,
    in layers that see every earlier position, and in sliding-window layers only while the
    position is among the last `window`."""
    bytes_per_layer_position: int
    windows: tuple[int | None, ...]   # per layer: its sliding window, None for full attention

    def step_bytes(self, positions: int) -> int:
        """The cache bytes a step that attends to `positions` positions reads."""
        return sum(self.bytes_per_layer_position * (positions if window is None else min(positions, window))
                   for window in self.windows)


def cache_layout(context, graph: str) -> CacheLayout:
    """The cache layout of graph `graph` of an engine's `context`: every layer under the model's
    sliding window when it has one for all layers, else the windows capture recorded on the
    attention calls of the layers that slide (`ATTENTION_WINDOW`), the others in full."""
    layers = len(context.signatures[graph].inputs_with_role(CACHE_ROLE)) // 2
    architecture = context.architectures[graph]
    element = torch.empty((), dtype=context.dtype).element_size()
    if architecture.sliding_window is not None:
        windows = (architecture.sliding_window,) * layers
    else:
        sliding = _recorded_windows(context.modules.get(graph))
        windows = (*sliding, *(None,) * (layers - len(sliding)))
    return CacheLayout(2 * architecture.num_key_value_heads * architecture.head_dim * element, windows)


def _recorded_windows(gm: fx.GraphModule | None) -> tuple[int, ...]:
    if gm is None:
        return ()
    return tuple(node.meta[ATTENTION_WINDOW] for module in graph_modules(gm) for node in module.graph.nodes
                 if node.op == "call_function" and node.meta.get(ATTENTION_WINDOW))


def kv_cache_read_bytes(layout: CacheLayout, runs: list, system: str, prompt_ids: list[list[int]]) -> float:
    """The mean bytes of cached keys and values one decode step of `system` read over `runs`."""
    generations = [(len(prompt_ids[run.prompt_index]), len(run.token_ids)) for run in runs if run.system == system]
    steps = positions_attended(generations)
    return statistics.fmean(layout.step_bytes(n) for n in steps) if steps else 0.0


def positions_attended(generations: list[tuple[int, int]]) -> list[int]:
    """The number of cached positions each one-row decode step attends to, over generations given
    as (prompt tokens, new tokens): the prefill gives the first new token, and the step that
    gives new token i (i >= 1) attends to the prompt and the i tokens before it."""
    return [prompt + i for prompt, new in generations for i in range(1, new)]
