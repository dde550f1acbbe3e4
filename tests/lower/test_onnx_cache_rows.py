"""The rewrite that makes cache writes exportable: it works on a copy, turns
each in-place cache write into an output of the rows written, and those rows
written back reproduce the in-place graph exactly; flat copies of segmented
graphs compute the same; writes it cannot express are refused."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from specc.errors import SpeccError
from specc.graph.nodes import output_node
from specc.graph.signature import GraphSignature, TensorSpec, read_signature
from specc.lower.onnx_cache_rows import expose_cache_writes, inline_submodules, write_rows_into_caches
from specc.contract.infrastructure import infrastructure_passes
from specc.passes.manager import run_passes
from specc.methods.specee.segment_by_layer import SegmentByLayer
from specc.testing.checkpoints import PASS_TEST_MAX_LEN, captured_tiny

aten = torch.ops.aten
LAYERS = 3


def cached_graph(segmented: bool = False) -> fx.GraphModule:
    _, captured = captured_tiny("llama", num_hidden_layers=LAYERS)
    passes = infrastructure_passes() + ([SegmentByLayer()] if segmented else [])
    return run_passes("target", captured.graph_module, passes)[0]


def step_inputs(start: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    """A causal chunk of `length` tokens after `start` cached ones, with random caches."""
    generator = torch.Generator().manual_seed(seed)
    slots = torch.arange(start, start + length)
    mask = (torch.arange(start + length)[None, :] <= slots[:, None])[None, None]
    caches = [torch.randn(1, 2, PASS_TEST_MAX_LEN + 1, 16, generator=generator) for _ in range(2 * LAYERS)]
    tokens = torch.randint(4, 96, (1, length), generator=generator)
    return [tokens, slots[None], mask, slots, *caches]


def count(gm: fx.GraphModule, target) -> int:
    return sum(n.op == "call_function" and n.target == target for n in gm.graph.nodes)


def test_cache_writes_become_row_outputs_and_rows_written_back_match_in_place():
    gm = cached_graph()
    signature = read_signature(gm)
    rewritten = expose_cache_writes(gm, signature)

    assert count(rewritten.module, aten.index_put_.default) == count(rewritten.module, aten.index_put.default) == 0
    writes = [n for n in rewritten.module.graph.nodes if n.target == aten.scatter.src]
    assert len(writes) == 2 * LAYERS
    assert all(w.args[0].target == aten.slice.Tensor for w in writes), "writes go into the attended window"
    assert [r.cache_input for r in rewritten.cache_rows] == list(range(4, 4 + 2 * LAYERS))
    assert rewritten.original_outputs == 1 and rewritten.returns_sequence
    assert count(gm, aten.index_put_.default) == 2 * LAYERS, "the original graph must be left alone"
    assert len(output_node(gm.graph).args[0]) == 1

    in_place = step_inputs(start=5, length=4)
    functional = [t.clone() for t in in_place]
    with torch.inference_mode():
        expected = gm(*in_place)
        outputs = rewritten.module(*functional)
    caches = functional[4:]
    assert all(torch.equal(c, f) for c, f in zip(step_inputs(5, 4)[4:], caches)), "the copy wrote a cache"
    torch.testing.assert_close(outputs[0], expected[0], rtol=0, atol=0)
    rows = outputs[1:]
    assert all(r.shape == (1, 2, 4, 16) for r in rows)
    write_rows_into_caches(caches, rows, functional[3])
    for written, reference in zip(caches, in_place[4:]):
        assert torch.equal(written, reference)


def test_inlined_segments_compute_what_the_segmented_graph_computes():
    gm = cached_graph(segmented=True)
    assert any(n.op == "call_module" for n in gm.graph.nodes)
    flat = inline_submodules(gm)
    assert not any(n.op == "call_module" for n in flat.graph.nodes)
    assert count(flat, aten.index_put_.default) == 2 * LAYERS
    segmented_inputs, flat_inputs = step_inputs(0, 6), step_inputs(0, 6)
    with torch.inference_mode():
        expected, got = gm(*segmented_inputs), flat(*flat_inputs)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(segmented_inputs, flat_inputs))


def test_rows_of_a_segmented_graph_are_exposed():
    gm = cached_graph(segmented=True)
    rewritten = expose_cache_writes(gm, read_signature(gm))
    assert len(rewritten.cache_rows) == 2 * LAYERS
    assert count(rewritten.module, aten.index_put_.default) == 0


def write_graph(index_of_slots) -> tuple[fx.GraphModule, GraphSignature]:
    """A one-cache graph that writes `rows` into `cache` at `index_of_slots(slots, other)`."""
    graph = fx.Graph()
    slots, other, cache, rows = (graph.placeholder(n) for n in ("slots", "other", "cache", "rows"))
    written = graph.call_function(aten.index_put_.default, (cache, [None, None, index_of_slots(slots, other)], rows))
    graph.output((graph.call_function(aten.sum.default, (written,)),))
    signature = GraphSignature((TensorSpec("slots", "cache_slots", "int64", ("q",)),
                                TensorSpec("other", "cache_slots_elsewhere", "int64", ("q",)),
                                TensorSpec("cache", "kv_cache", "float", (1, 2, 8, 4)),
                                TensorSpec("rows", "rows", "float", (1, 2, "q", 4))),
                               (TensorSpec("total", "total", "float", ()),))
    return fx.GraphModule(torch.nn.Module(), graph), signature


def test_a_plain_write_at_the_cache_slots_is_accepted():
    gm, signature = write_graph(lambda slots, other: slots)
    rewritten = expose_cache_writes(gm, signature)
    assert [r.cache_input for r in rewritten.cache_rows] == [2]


def test_a_write_at_other_indices_is_refused():
    gm, signature = write_graph(lambda slots, other: other)
    with pytest.raises(SpeccError, match="at the cache-slots input only"):
        expose_cache_writes(gm, signature)


def test_a_cache_read_beside_its_write_is_refused():
    gm, signature = write_graph(lambda slots, other: slots)
    cache = next(n for n in gm.graph.nodes if n.target == "cache")
    with gm.graph.inserting_before(output_node(gm.graph)):
        gm.graph.call_function(aten.clone.default, (cache,))
    with pytest.raises(SpeccError, match="read only through the write's result"):
        expose_cache_writes(gm, signature)
