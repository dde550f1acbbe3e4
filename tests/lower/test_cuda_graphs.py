"""CudaGraphs' bookkeeping (buckets, padding, static caches, copies, fallback), with the
capture replaced by a recorder so it runs on the CPU; the real capture is tested in tests/gpu."""

from __future__ import annotations

import pytest
import torch

from specc.graph.signature import GraphSignature, TensorSpec
from specc.lower import cuda_graphs
from specc.lower.cuda_graphs import CudaGraphs


class Recorded:
    """Stands in for a captured CUDA graph: keeps the inputs it was 'captured' with and
    reruns the forward on them at replay, writing into its own output buffers."""

    captures = 0

    def __init__(self, forward, inputs, outputs):
        self.forward, self.inputs, self.outputs = forward, inputs, outputs

    @classmethod
    def record(cls, forward, args, static, pool):
        cls.captures += 1
        inputs = [a if i in static else a.clone() for i, a in enumerate(args)]
        return cls(forward, inputs, list(forward(*inputs)))

    def replay(self, args, copied):
        for i in copied:
            self.inputs[i].copy_(args[i])
        for buffer, fresh in zip(self.outputs, self.forward(*self.inputs)):
            buffer.copy_(fresh)
        return list(self.outputs)


def _signature() -> GraphSignature:
    return GraphSignature(
        inputs=(TensorSpec("tokens", "tokens", "int64", (1, "q")),
                TensorSpec("cache", "kv_cache", "float", (1, "slots"))),
        outputs=(TensorSpec("logits", "logits", "float", (1, "q", "vocab")),))


def _forward(tokens, cache):
    """Writes each token at its own slot of the cache and returns a per-row value."""
    cache[0, tokens[0]] = tokens[0].float()
    return ((tokens[0, :, None].float() * 10 + cache.sum())[None],)


@pytest.fixture(autouse=True)
def recorder(monkeypatch):
    Recorded.captures = 0
    monkeypatch.setattr(cuda_graphs, "_Captured", Recorded)


def test_calls_pad_to_a_bucket_replay_and_return_only_their_rows():
    cache = torch.zeros(1, 16)
    graphs = CudaGraphs(_forward, _signature(), pool=object(), buckets=(1, 4, 8))
    (first,) = graphs(torch.tensor([[3, 5, 7]]), cache)
    assert first.shape == (1, 3, 1) and Recorded.captures == 1
    (again,) = graphs(torch.tensor([[1, 2]]), cache)   # 2 rows: the same 4-row bucket, replayed
    assert again.shape == (1, 2, 1) and Recorded.captures == 1 and graphs.replays == 2
    assert cache[0, [1, 2, 3, 5, 7]].tolist() == [1, 2, 3, 5, 7]
    expected = torch.tensor([1.0, 2.0])[:, None] * 10 + cache.sum()
    assert torch.equal(again[0], expected)


def test_outputs_are_copies_a_later_replay_does_not_overwrite():
    cache = torch.zeros(1, 16)
    graphs = CudaGraphs(_forward, _signature(), pool=object(), buckets=(4,))
    (first,) = graphs(torch.tensor([[3]]), cache)
    kept = first.clone()
    graphs(torch.tensor([[9]]), cache)
    assert torch.equal(first, kept)


def test_another_cache_tensor_is_another_graph():
    graphs = CudaGraphs(_forward, _signature(), pool=object(), buckets=(4,))
    graphs(torch.tensor([[1]]), torch.zeros(1, 16))
    graphs(torch.tensor([[1]]), torch.zeros(1, 16))
    assert Recorded.captures == 2


def test_more_rows_than_the_largest_bucket_run_uncaptured():
    graphs = CudaGraphs(_forward, _signature(), pool=object(), buckets=(1, 2))
    (out,) = graphs(torch.tensor([[1, 2, 3]]), torch.zeros(1, 16))
    assert out.shape == (1, 3, 1) and Recorded.captures == 0 and graphs.replays == 0


def test_a_failed_capture_falls_back_to_plain_calls(monkeypatch):
    def refuse(*args):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(Recorded, "record", classmethod(lambda cls, *a: refuse()))
    graphs = CudaGraphs(_forward, _signature(), pool=object(), buckets=(4,))
    cache = torch.zeros(1, 16)
    (out,) = graphs(torch.tensor([[2, 6]]), cache)
    assert out.shape == (1, 2, 1) and graphs.uncapturable and cache[0, 6] == 6
    graphs(torch.tensor([[1]]), cache)
    assert graphs.replays == 0


def _selecting_signature() -> GraphSignature:
    return GraphSignature(
        inputs=(TensorSpec("tokens", "tokens", "int64", (1, "q")),
                TensorSpec("cache", "kv_cache", "float", (1, "slots")),
                TensorSpec("logit_rows", "logit_rows", "int64", ("r",))),
        outputs=(TensorSpec("logits", "logits", "float", (1, "r", "vocab")),))


def _selecting_forward(tokens, cache, rows):
    cache[0, tokens[0]] = tokens[0].float()
    return ((tokens[0, rows, None].float() * 10)[None],)


def test_logit_rows_pad_to_the_bucket_so_a_chunk_asking_for_its_last_row_replays_the_same_graph():
    graphs = CudaGraphs(_selecting_forward, _selecting_signature(), pool=object(), buckets=(4,))
    cache = torch.zeros(1, 16)
    (verified,) = graphs(torch.tensor([[3, 5]]), cache, torch.arange(2))
    (last,) = graphs(torch.tensor([[1, 2, 9]]), cache, torch.tensor([2]))
    assert verified[0, :, 0].tolist() == [30.0, 50.0] and last[0, :, 0].tolist() == [90.0]
    assert Recorded.captures == 1 and graphs.replays == 2
    assert cache[0, [1, 2, 3, 5, 9]].tolist() == [1, 2, 3, 5, 9]
