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
of a few passes, and reports the median with the range. Weight bytes count
every parameter once (a tied embedding and LM head read one matrix) at the
engine's dtype, except the linear layers a quantized engine packed, which
count at their packed size with their scales (the manifest's
`quantization.bytes`); activations and the KV cache are left out, so the
bound is slightly optimistic.
"""

from __future__ import annotations

import statistics
import time

import torch

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

    def bound(self, weight_bytes: int) -> dict:
        if not self.values:
            self()
        return decode_bound(weight_bytes, self.values)


def weight_bytes_per_token(parameters: int, manifest: dict) -> int:
    """Bytes of weights one decode step of the engine reads: `parameters` at the engine's dtype,
    with the linear weights its `--quantize` packed counted at their packed size instead."""
    weight_bytes = parameters * torch.empty((), dtype=getattr(torch, manifest["dtype"])).element_size()
    quantization = manifest.get("quantization")
    if quantization:
        packed = quantization["bytes"]
        weight_bytes += packed["quantized"] - packed["unquantized"]
    return weight_bytes


def checkpoint_parameters(checkpoint) -> int:
    """The checkpoint's parameter count (a tied embedding and LM head once), from its config alone:
    the model is built on the meta device, so nothing is loaded."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return sum(p.numel() for p in model.parameters())


def decode_bound(weight_bytes: int, samples: list[float]) -> dict:
    """The tokens per second the median read rate allows a step that reads `weight_bytes`."""
    median = statistics.median(samples)
    return {"weight_bytes_per_token": weight_bytes, "read_bytes_per_second": round(median),
            "read_bytes_per_second_range": [round(min(samples)), round(max(samples))],
            "read_samples": len(samples),
            "bound_tokens_per_second": median / weight_bytes,
            "bound_tokens_per_second_range": [min(samples) / weight_bytes, max(samples) / weight_bytes],
            "measured_by": f"median of {len(samples)} sample(s) taken between repeats, each the best of "
                           f"{PASSES} torch sums over a {BUFFER_BYTES // 2**20} MiB float32 buffer after a "
                           f"{WARMUP_SECONDS:g} s warm-up, {torch.get_num_threads()} thread(s)"}
