"""Replay each graph call on a CUDA device as a captured CUDA graph.

On a GPU a decode step of a small model is a few hundred short kernels, and
launching them one by one from Python costs more than running them. So on
CUDA every call of a lowered graph (eager, Inductor or AOTInductor) runs as
a CUDA graph, captured on the first call of its shape and replayed after.

Shapes are made few: query rows are padded up to a bucket (`ROW_BUCKETS`,
the last row repeated, as `specc.lower.row_padding` pads: a repeated row
writes the same K/V to the same slot), and the key axis is already a
multiple of `specc.runtime.masks.KEY_BLOCK`. A graph per (rows, keys) pair
is captured lazily; calls with more rows than the largest bucket (prompt
chunks) run uncaptured. The KV caches are graph inputs that keep their
addresses, so a captured graph reads and writes the live caches; every
other input is copied into the graph's own buffers before a replay, and
outputs are copied out after it (the next replay overwrites them).

A call whose capture fails (an operation CUDA graphs cannot record) runs
uncaptured from then on; `CudaGraphs.uncapturable` says which shapes.
"""

from __future__ import annotations

import logging

import torch

from specc.graph.signature import CACHE_ROLE, LOGIT_ROWS_DIM
from specc.lower.row_padding import axes_named, padding_for, q_axes, real_rows

log = logging.getLogger("specc")

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class CudaGraphs:
    """`forward` (a lowered graph with `signature`) replayed from CUDA graphs, one per shape."""

    def __init__(self, forward, signature, pool=None, buckets: tuple[int, ...] = ROW_BUCKETS):
        self.forward = forward
        self.buckets = buckets
        self.static_inputs = frozenset(i for i, spec in enumerate(signature.inputs) if spec.role == CACHE_ROLE)
        self.copied_inputs = tuple(i for i in range(len(signature.inputs)) if i not in self.static_inputs)
        self.first_static = min(self.static_inputs, default=None)
        self.last_static = max(self.static_inputs, default=None)
        self.paddings = {bucket: padding_for(signature, bucket) for bucket in buckets}
        self.row_inputs = (q_axes(signature.inputs), axes_named(signature.inputs, LOGIT_ROWS_DIM))
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple, _Captured] = {}
        self.uncapturable: set[tuple] = set()
        self.replays = 0

    def __call__(self, *args):
        paddings = self._paddings(args)
        if paddings is None:
            return self.forward(*args)
        padding, real = paddings
        padded = padding.pad(args)
        key = self._key(padded)
        if key in self.uncapturable:
            return padding.unpad(self.forward(*padded), real)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key, padded)
            if graph is None:
                return padding.unpad(self.forward(*padded), real)
        self.replays += 1
        return padding.unpad(graph.replay(padded, self.copied_inputs), real, copy=True)

    def _paddings(self, args):
        """The padding of this call to its row bucket and the call's real row counts; None
        for a graph without query rows or a call past the largest bucket (run uncaptured).
        Logit rows are padded to the bucket too, so a prompt chunk asking for its last
        row's logits replays the bucket's one graph."""
        if not self.row_inputs[0]:
            return None
        real = real_rows(args, *self.row_inputs)
        bucket = next((b for b in self.buckets if b >= real[0]), None)
        return None if bucket is None else (self.paddings[bucket], real)

    def _key(self, args) -> tuple:
        """The shapes of the copied inputs and where the caches live. A captured graph holds
        the addresses of the caches it was captured with; the first and last cache tensors'
        addresses tell one cache set from another without reading all of them every call."""
        shapes = tuple(tuple(args[i].shape) for i in self.copied_inputs)
        if self.first_static is None:
            return shapes, None
        return shapes, args[self.first_static].data_ptr(), args[self.last_static].data_ptr()

    def _capture(self, key: tuple, args: list):
        try:
            graph = _Captured.record(self.forward, args, self.static_inputs, self.pool)
        except Exception as exc:   # noqa: BLE001 - any capture failure falls back to plain calls
            log.warning("CUDA graph capture failed for input shapes %s (%s: %s); running those calls uncaptured",
                        list(key[0]), type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            self.uncapturable.add(key)
            return None
        self.graphs[key] = graph
        return graph


class _Captured:
    def __init__(self, graph, inputs, outputs, single: bool):
        self.graph, self.inputs, self.outputs, self.single = graph, inputs, outputs, single

    @classmethod
    def record(cls, forward, args: list, static: frozenset, pool) -> "_Captured":
        """Warm up once on a side stream (as CUDA graph capture requires), then capture."""
        inputs = [a if i in static else a.clone() for i, a in enumerate(args)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(*inputs)   # the real call's inputs: cache writes are the ones the call makes anyway
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            result = forward(*inputs)
        single = not isinstance(result, (list, tuple))
        return cls(graph, inputs, [result] if single else list(result), single)

    def replay(self, args: list, copied: tuple[int, ...]):
        for i in copied:
            self.inputs[i].copy_(args[i], non_blocking=True)
        self.graph.replay()
        return self.outputs[0] if self.single else list(self.outputs)
