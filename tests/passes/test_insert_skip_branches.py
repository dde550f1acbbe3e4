"""insert_skip_branches: numbers match eager, structure, idempotence, no-op elsewhere."""

from __future__ import annotations

import copy
import functools
import json

import pytest
import torch

from specc.errors import UsageError
from specc.graph.serialize import graph_attributes, graph_from_json, graph_to_json
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.swift.insert_skip_branches import InsertSkipBranches, SkipBranchesConfig, skip_branches
from specc.methods.specee.segment_by_layer import SegmentByLayer
from specc.testing.checkpoints import FAMILIES, captured_tiny, non_matching_graph, run_cached_steps

aten = torch.ops.aten
LAYERS = 4
IDS = torch.randint(4, 96, (1, 11), generator=torch.Generator().manual_seed(3))
CHUNKS = [(0, 4), (4, 5), (5, 8), (8, 11)]


def cached_graph(family: str = "llama", layers: int = LAYERS):
    """A fresh copy of the tiny model's cached decoding graph, its
    architecture and the Hugging Face logits for IDS."""
    gm, arch, reference = _captured_once(family, layers)
    return copy.deepcopy(gm), arch, reference


@functools.lru_cache(maxsize=None)
def _captured_once(family: str, layers: int):
    model, captured = captured_tiny(family, num_hidden_layers=layers)
    gm = captured.graph_module
    for graph_pass in infrastructure_passes():
        graph_pass(gm)
    with torch.inference_mode():
        reference = model(IDS).logits
    return gm, captured.architecture, reference


def calls(gm) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


@pytest.mark.parametrize("family", FAMILIES)
def test_segmented_graph_matches_eager_step_by_step(family):
    gm, arch, reference = cached_graph(family)
    result = InsertSkipBranches()(gm)
    assert result.modified
    stepped = run_cached_steps(result.graph_module, IDS, CHUNKS, arch)
    torch.testing.assert_close(stepped, reference, rtol=1e-4, atol=1e-5)


def test_structure_segments_streams_and_kv_writes():
    gm, _, _ = cached_graph()
    split = InsertSkipBranches()(gm).graph_module
    assert calls(split) == ["prologue", "attn_1", "mlp_1", "attn_2", "mlp_2", "epilogue"]
    assert skip_branches(split) == ["attn_1", "mlp_1", "attn_2", "mlp_2"]
    call_nodes = {n.target: n for n in split.graph.nodes if n.op == "call_module"}
    for name in skip_branches(split):
        node, segment = call_nodes[name], split.get_submodule(name)
        writes = [n for n in segment.graph.nodes if n.target == aten.index_put_.default]
        assert len(writes) == (2 if name.startswith("attn") else 0), "only attention writes KV"
        result = next(n for n in segment.graph.nodes if n.op == "output").args[0]
        assert isinstance(result, torch.fx.Node), "a skip branch returns the residual stream alone"
        feeder = node.args[0]
        assert feeder.op == "call_module" or feeder.target.__name__ == "getitem", \
            "the first input is the stream produced by the segment before"
    # the protected first and last layers travel whole in prologue and epilogue
    assert len([n for n in split.prologue.graph.nodes if n.target == aten.index_put_.default]) == 2
    assert len([n for n in split.epilogue.graph.nodes if n.target == aten.index_put_.default]) == 2


def test_skip_branch_roles_survive_serialization():
    gm, arch, reference = cached_graph()
    split = InsertSkipBranches()(gm).graph_module
    restored = graph_from_json(json.loads(json.dumps(graph_to_json(split))), graph_attributes(split))
    assert skip_branches(restored) == skip_branches(split)
    torch.testing.assert_close(run_cached_steps(restored, IDS, CHUNKS, arch), reference, rtol=1e-4, atol=1e-5)


def test_idempotent():
    gm, _, _ = cached_graph()
    split = InsertSkipBranches()(gm).graph_module
    code = split.code
    again = InsertSkipBranches()(split)
    assert not again.modified and again.graph_module.code == code


def test_no_op_on_graphs_it_does_not_match():
    plain = non_matching_graph()
    code = plain.code
    result = InsertSkipBranches()(plain)
    assert not result.modified and result.graph_module.code == code
    gm, _, _ = cached_graph()
    by_layer = SegmentByLayer()(gm).graph_module
    assert not InsertSkipBranches()(by_layer).modified


def test_protected_layers_are_configurable():
    gm, arch, reference = cached_graph(layers=5)
    split = InsertSkipBranches(SkipBranchesConfig(protected_first=2, protected_last=0))(gm).graph_module
    assert skip_branches(split) == ["attn_2", "mlp_2", "attn_3", "mlp_3", "attn_4", "mlp_4"]
    assert calls(split)[-1] == "epilogue"
    torch.testing.assert_close(run_cached_steps(split, IDS, CHUNKS, arch), reference, rtol=1e-4, atol=1e-5)
    with pytest.raises(UsageError, match="protected_first"):
        SkipBranchesConfig(protected_first=0)
