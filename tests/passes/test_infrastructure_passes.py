"""Each infrastructure pass: numbers match eager, structure, idempotence, no-op elsewhere."""

from __future__ import annotations

import pytest
import torch

from specc.testing.checkpoints import captured_tiny, non_matching_graph, run_cached_steps
from specc.errors import SpeccError
from specc.graph.nodes import attention_nodes, placeholder
from specc.passes.expose_position_ids import ExposePositionIds
from specc.passes.insert_attention_mask import InsertAttentionMask
from specc.passes.insert_kv_cache import InsertKVCache
from specc.methods.specee.segment_by_layer import SegmentByLayer

aten = torch.ops.aten
IDS = torch.randint(4, 96, (1, 11), generator=torch.Generator().manual_seed(3))


def reference_logits(model):
    with torch.inference_mode():
        return model(IDS).logits


def placeholders(gm):
    return [n.target for n in gm.graph.nodes if n.op == "placeholder"]


def test_expose_position_ids_reads_positions_from_input():
    model, captured = captured_tiny()
    gm = captured.graph_module
    result = ExposePositionIds()(gm)
    assert result.modified and placeholders(gm) == ["input_ids", "position_ids"]
    assert not any(n.target == aten.arange.default and n.users and "rotary" in str(n.meta) for n in gm.graph.nodes)
    with torch.inference_mode():
        out = gm(IDS, torch.arange(11)[None])[0]
        shifted = gm(IDS, torch.arange(5, 16)[None])[0]
    torch.testing.assert_close(out, reference_logits(model), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, shifted), "positions must actually reach the rotary embedding"
    assert not ExposePositionIds()(gm).modified


def test_insert_attention_mask_feeds_every_attention():
    model, captured = captured_tiny()
    gm = captured.graph_module
    ExposePositionIds()(gm)
    result = InsertAttentionMask()(gm)
    mask_node = placeholder(gm.graph, "attn_mask")
    assert result.modified and mask_node is not None
    assert all(n.args[3] is mask_node for n in attention_nodes(gm.graph))
    causal = torch.ones(11, 11, dtype=torch.bool).tril()[None, None]
    with torch.inference_mode():
        out = gm(IDS, torch.arange(11)[None], causal)[0]
        full = gm(IDS, torch.arange(11)[None], torch.ones_like(causal))[0]
    torch.testing.assert_close(out, reference_logits(model), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[:, :-1], full[:, :-1]), "the mask input must be honoured"
    assert not InsertAttentionMask()(gm).modified


def test_insert_kv_cache_step_by_step_matches_full_forward():
    model, captured = captured_tiny()
    gm = captured.graph_module
    for p in (ExposePositionIds(), InsertAttentionMask()):
        p(gm)
    result = InsertKVCache()(gm)
    layers = captured.architecture.num_layers
    assert result.modified
    assert placeholders(gm)[3:] == ["cache_positions"] + [f"{kv}_cache_{i}" for i in range(layers) for kv in "kv"]
    writes = [n for n in gm.graph.nodes if n.target == aten.index_put_.default]
    assert len(writes) == 2 * layers
    assert not any(n.target in (aten.clone.default, aten.copy_.default, aten.cat.default)
                   and any(a.op == "placeholder" and "cache" in a.target for a in n.all_input_nodes)
                   for n in gm.graph.nodes), "no whole-cache copy may appear in the graph"
    stepped = run_cached_steps(gm, IDS, [(0, 4), (4, 5), (5, 8), (8, 11)], captured.architecture)
    torch.testing.assert_close(stepped, reference_logits(model), rtol=1e-4, atol=1e-5)
    assert not InsertKVCache()(gm).modified


def test_insert_kv_cache_requires_the_mask_input():
    _, captured = captured_tiny()
    with pytest.raises(SpeccError, match="insert_attention_mask first"):
        InsertKVCache()(captured.graph_module)


def test_segment_by_layer_splits_and_preserves_numbers():
    model, captured = captured_tiny()
    gm = captured.graph_module
    for p in (ExposePositionIds(), InsertAttentionMask(), InsertKVCache()):
        p(gm)
    result = SegmentByLayer()(result_gm := gm)
    segmented = result.graph_module
    layers = captured.architecture.num_layers
    assert result.inserted == ["prologue"] + [f"layer_{i}" for i in range(layers)] + ["epilogue"]
    calls = [n.target for n in segmented.graph.nodes if n.op == "call_module"]
    assert calls == result.inserted
    for i in range(layers):
        layer = segmented.get_submodule(f"layer_{i}")
        assert len(attention_nodes(layer.graph)) == 1
    stepped = run_cached_steps(segmented, IDS, [(0, 6), (6, 11)], captured.architecture)
    torch.testing.assert_close(stepped, reference_logits(model), rtol=1e-4, atol=1e-5)
    assert not SegmentByLayer()(segmented).modified
    assert result_gm is not segmented


@pytest.mark.parametrize("graph_pass", [ExposePositionIds(), InsertAttentionMask(), InsertKVCache(), SegmentByLayer()])
def test_pass_is_a_no_op_on_a_non_matching_graph(graph_pass):
    gm = non_matching_graph()
    before = gm.code
    result = graph_pass(gm)
    assert not result.modified and result.graph_module.code == before
