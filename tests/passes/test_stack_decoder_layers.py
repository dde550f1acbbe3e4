"""stack_decoder_layers: consecutive `specc.decoder_layer` calls of one shape become one
`specc.decoder_stack` call that computes the same bits and cache writes, step by step and in calls
of several rows; a layer whose residual something else reads ends a stack."""

from __future__ import annotations

import copy
import operator

import pytest
import torch

from specc.passes.fuse_decoder_chain import DECODER_LAYER, FuseDecoderChain
from specc.contract.program import graph_copy
from specc.passes.manager import run_passes
from specc.passes.stack_decoder_layers import DECODER_STACK, StackDecoderLayers
from specc.testing.checkpoints import captured_tiny, empty_caches, non_matching_graph, run_cached_steps
from tests.passes.test_fuse_decoder_chain import _quantized


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def graphs(request):
    quantized, arch = _quantized(request.param)
    fused, _ = run_passes("target", quantized, [FuseDecoderChain()])
    stacked, records = run_passes("target", graph_copy(fused), [StackDecoderLayers()])
    assert records[0].modified
    return fused, stacked, arch


def _calls(gm, target) -> list:
    return [node for node in gm.graph.nodes if node.target == target]


def _caches(arch) -> list:
    return [cache.to(torch.bfloat16) for cache in empty_caches(arch)]


def test_the_layers_after_the_first_run_as_one_call(graphs):
    fused, stacked, arch = graphs
    layers = _calls(fused, DECODER_LAYER)
    assert len(layers) == arch.num_layers - 1 >= 2
    (stack,) = _calls(stacked, DECODER_STACK)
    assert not _calls(stacked, DECODER_LAYER)
    assert len(stack.args[4]) == len(layers) and len(stack.args[16]) == len(layers) + 1
    assert not StackDecoderLayers()(graph_copy(stacked)).modified


@pytest.mark.parametrize("chunks", [[(0, 8), *((i, i + 1) for i in range(8, 12))], [(0, 8), (8, 12)], [(0, 5), (5, 7),
                                                                                                        (7, 12)]],
                         ids=["one-row steps", "a call of four rows", "calls of two and five rows"])
def test_the_stack_computes_the_layers_bits(graphs, chunks):
    fused, stacked, arch = graphs
    ids = torch.randint(0, arch.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    caches = {gm: _caches(arch) for gm in (fused, stacked)}
    got, want = (run_cached_steps(gm, ids, chunks, arch, caches=caches[gm]) for gm in (stacked, fused))
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(caches[stacked], caches[fused]))


def test_a_residual_read_elsewhere_ends_a_stack():
    quantized, arch = _quantized("llama")
    fused, _ = run_passes("target", quantized, [FuseDecoderChain()])
    layers = _calls(fused, DECODER_LAYER)
    residual = next(user for user in layers[0].users if user.args[1] == 0)
    with fused.graph.inserting_before(fused.graph.output_node()):   # an exit reading the first layer's residual
        fused.graph.call_function(torch.ops.aten.sum.default, (residual,))
    for node in fused.graph.nodes:
        if node.op == "output":
            outputs = node.args[0]
    exit_node = [n for n in fused.graph.nodes if n.target == torch.ops.aten.sum.default][-1]
    fused.graph.output_node().args = ((*outputs, exit_node),)
    fused.recompile()
    stacked = StackDecoderLayers()(graph_copy(fused)).graph_module
    kept = _calls(stacked, DECODER_LAYER)
    assert kept[0].name == layers[0].name and len(kept) == (1 if len(layers) > 2 else len(layers))
    assert len(_calls(stacked, DECODER_STACK)) == (1 if len(layers) > 2 else 0)


def test_a_graph_without_decoder_layers_is_left_alone():
    _, captured = captured_tiny("llama", dtype="bfloat16")
    assert not StackDecoderLayers()(copy.deepcopy(captured.graph_module)).modified
    assert not StackDecoderLayers()(non_matching_graph()).modified
