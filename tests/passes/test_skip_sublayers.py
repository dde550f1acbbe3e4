"""skip_sublayers: the cut graph computes what the segmented graph computes
with the same skip set (KV writes included), idempotent, no-op elsewhere."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.errors import UsageError
from specc.methods.swift.segments import SkippingForward
from specc.methods.swift.insert_skip_branches import InsertSkipBranches
from specc.methods.swift.skip_sublayers import SkipSublayers, SkipSublayersConfig, residual_closes
from specc.testing.checkpoints import FAMILIES, empty_caches, non_matching_graph, run_cached_steps

from tests.passes.test_insert_skip_branches import CHUNKS, IDS, cached_graph

aten = torch.ops.aten
SKIP = ("attn_1", "mlp_2", "attn_2")


def run_steps(forward, arch, *extra):
    """Logits of IDS fed chunk by chunk, and the KV caches afterwards."""
    caches = empty_caches(arch)
    return run_cached_steps(forward, IDS, CHUNKS, arch, *extra, caches=caches), caches


@pytest.mark.parametrize("family", FAMILIES)
def test_cut_graph_matches_the_segments_with_the_same_skip_set(family):
    gm, arch, _ = cached_graph(family)
    segmented = InsertSkipBranches()(copy.deepcopy(gm)).graph_module
    expected, expected_caches = run_steps(SkippingForward(segmented, lambda s: s), arch, frozenset(SKIP))
    result = SkipSublayers(SkipSublayersConfig(SKIP))(gm)
    assert result.modified and len(result.replaced) == len(SKIP)
    logits, caches = run_steps(result.graph_module, arch)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    for cut, segments in zip(caches, expected_caches):
        torch.testing.assert_close(cut, segments, rtol=1e-4, atol=1e-5)
    untouched = caches[2 * 1 + 0], caches[2 * 2 + 1]   # attn_1 and attn_2 are skipped: no KV written
    assert all(not c.any() for c in untouched)


def test_structure_inputs_kept_and_skipped_writes_gone():
    gm, arch, _ = cached_graph()
    inputs = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    writes = sum(n.target == aten.index_put_.default for n in gm.graph.nodes)
    cut = SkipSublayers(SkipSublayersConfig(SKIP))(gm).graph_module
    assert [n.name for n in cut.graph.nodes if n.op == "placeholder"] == inputs, "the calling convention stays"
    assert sum(n.target == aten.index_put_.default for n in cut.graph.nodes) == writes - 4, \
        "two skipped attentions: their K and V writes are gone"
    assert sorted(residual_closes(cut.graph)) == sorted(
        {f"{kind}_{i}" for kind in ("attn", "mlp") for i in range(arch.num_layers)} - set(SKIP))


def test_idempotent_and_no_op_elsewhere():
    gm, arch, _ = cached_graph()
    cut = SkipSublayers(SkipSublayersConfig(SKIP))(gm).graph_module
    code = cut.code
    again = SkipSublayers(SkipSublayersConfig(SKIP))(cut)
    assert not again.modified and again.graph_module.code == code
    assert not SkipSublayers(SkipSublayersConfig(()))(cached_graph()[0]).modified
    assert not SkipSublayers(SkipSublayersConfig(SKIP))(non_matching_graph()).modified


def test_bad_names_are_usage_errors():
    with pytest.raises(UsageError, match="attn_<layer> or mlp_<layer>"):
        SkipSublayersConfig(("layer_2",))
    with pytest.raises(UsageError, match="layers 0..3"):
        SkipSublayers(SkipSublayersConfig(("mlp_9",)))(cached_graph()[0])
    with pytest.raises(UsageError, match="reads the embedding"):
        SkipSublayers(SkipSublayersConfig(("attn_0",)))(cached_graph()[0])
