"""fuse_decoder_chain: on a graph of specc's blocked kernels, each decoder layer's chain from its
attention's output to the next layer's projection becomes one `specc.decoder_chain` call that
computes what the chain computed (to bfloat16 roundings), rows alike at any row count, from one
buffer of the layer's weights that the graphs of a program share; the last layer and graphs of
other forms keep their calls."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.contract.infrastructure import infrastructure_passes
from specc.contract.program import graph_copy
from specc.graph.nodes import attribute
from specc.kernels.decoder_chain import named_operands, pack_layer
from specc.passes.fuse_decoder_chain import (DECODER_CHAIN, DECODER_CHAIN_INTO_CACHE, DECODER_LAYER, MATMUL,
                                             ROW_ATTENTION, FuseDecoderChain)
from specc.passes.manager import run_passes
from specc.passes.quantize_linear_weights import QuantizeLinearWeights
from specc.passes.use_row_attention import UseRowAttention
from specc.quantize.schemes import parse_scheme
from specc.testing.checkpoints import captured_tiny, empty_caches, non_matching_graph, run_cached_steps


def _quantized(family: str):
    _, captured = captured_tiny(family, dtype="bfloat16")
    full, _ = run_passes("target", captured.graph_module, infrastructure_passes())
    quantized, _ = run_passes("target", full, [QuantizeLinearWeights(parse_scheme("q4")), UseRowAttention(4)])
    return quantized, captured.architecture


# Llama's and Qwen2's layers run from their attention to the next one's cache writes (Qwen2's
# q/k/v biases added on the way).
FUSED_AS = {"llama": DECODER_LAYER, "qwen2": DECODER_LAYER}
CHAINS = (DECODER_CHAIN, DECODER_CHAIN_INTO_CACHE, DECODER_LAYER)


@pytest.fixture(scope="module", params=sorted(FUSED_AS))
def graphs(request):
    quantized, arch = _quantized(request.param)
    fused, records = run_passes("target", copy.deepcopy(quantized), [FuseDecoderChain()])
    assert records[0].modified
    return quantized, fused, arch, FUSED_AS[request.param]


def _calls(gm, target) -> int:
    return sum(node.target == target for node in gm.graph.nodes)


def _caches(arch) -> list:
    return [cache.to(torch.bfloat16) for cache in empty_caches(arch)]


def test_every_layer_but_the_last_runs_its_chain_as_one_call(graphs):
    quantized, fused, arch, operator = graphs
    assert _calls(fused, operator) == arch.num_layers - 1
    assert sum(_calls(fused, chain) for chain in CHAINS) == arch.num_layers - 1
    writes = sum(node.target == torch.ops.aten.index_put_.default for node in fused.graph.nodes)
    in_layers = operator == DECODER_LAYER
    assert writes == 2 * arch.num_layers - (2 * (arch.num_layers - 1) if in_layers else 0)
    assert _calls(fused, ROW_ATTENTION) == (1 if in_layers else arch.num_layers)
    # each fused chain takes the place of four matmuls: o, gate/up, down, and the next q/k/v
    assert _calls(quantized, MATMUL) - _calls(fused, MATMUL) == 4 * (arch.num_layers - 1)
    assert not FuseDecoderChain()(fused).modified


def test_the_fused_graph_computes_what_the_chain_computed(graphs):
    quantized, fused, arch, _ = graphs
    ids = torch.randint(0, arch.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    chunks = [(0, 8), (8, 9), (9, 11), (11, 12)]
    caches = {gm: _caches(arch) for gm in (fused, quantized)}
    got, want = (run_cached_steps(gm, ids, chunks, arch, caches=caches[gm]).float() for gm in (fused, quantized))
    torch.testing.assert_close(got, want, rtol=0.03, atol=0.03 * want.abs().amax().item())
    for written, expected in zip(caches[fused], caches[quantized]):   # the same keys and values, where written
        torch.testing.assert_close(written[:, :, :12].float(), expected[:, :, :12].float(), rtol=0.05,
                                   atol=0.05 * expected.abs().amax().item())


def test_a_call_of_several_rows_computes_the_bits_of_one_row_steps(graphs):
    _, fused, arch, _ = graphs
    ids = torch.randint(0, arch.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    caches = [_caches(arch), _caches(arch)]
    stepwise = run_cached_steps(fused, ids, [(0, 8), *((i, i + 1) for i in range(8, 12))], arch, caches=caches[0])
    together = run_cached_steps(fused, ids, [(0, 8), (8, 12)], arch, caches=caches[1])
    assert torch.equal(stepwise[:, 8:], together[:, 8:])
    assert all(torch.equal(a, b) for a, b in zip(*caches))


def _packs(gm) -> list[torch.Tensor]:
    return [attribute(gm, named_operands(node.target, node.args)["weights"].target)
            for node in gm.graph.nodes if node.target in CHAINS]


def test_a_layer_s_weights_are_one_pack_shared_by_the_graphs_of_a_program(graphs):
    quantized, fused, _, _ = graphs
    matmuls = [node for node in quantized.graph.nodes if node.target == MATMUL]
    o, gate_up, down, next_weight = (attribute(quantized, m.args[1].target) for m in matmuls[1:5])
    assert torch.equal(_packs(fused)[0], pack_layer(o, gate_up, down, next_weight, torch.get_num_threads()))
    store = {}
    first, second = (FuseDecoderChain(packed_threads=3, store=store)(graph_copy(quantized)).graph_module
                     for _ in range(2))
    assert [p.data_ptr() for p in _packs(first)] == [p.data_ptr() for p in _packs(second)]
    assert torch.equal(_packs(first)[0], pack_layer(o, gate_up, down, next_weight, 3))


def test_qwen2_s_biases_are_stacked_once_and_leave_no_add_behind():
    quantized, _ = _quantized("qwen2")
    store = {}
    first, second = (FuseDecoderChain(store=store)(graph_copy(quantized)).graph_module for _ in range(2))
    biases = [[named_operands(node.target, node.args)["next_bias"] for node in gm.graph.nodes if node.target in CHAINS]
              for gm in (first, second)]
    assert all(b is not None for b in biases[0])
    stacked = attribute(first, biases[0][0].target)
    layer = "model.layers.1.self_attn."
    parts = [attribute(quantized, f"{layer}{name}_proj.bias") for name in "qkv"]
    assert biases[0][0].target == f"{layer}q_proj_k_proj_v_proj_bias" and torch.equal(stacked, torch.cat(parts))
    assert stacked.data_ptr() == attribute(second, biases[1][0].target).data_ptr()
    bias_adds = [node for node in first.graph.nodes if node.target == torch.ops.aten.add.Tensor
                 and any(getattr(a, "op", None) == "get_attr" and a.target.endswith("_proj.bias") for a in node.args)]
    assert len(bias_adds) == 3   # the first layer's, whose q/k/v no chain computes


def test_a_graph_without_blocked_matmuls_is_left_alone():
    _, captured = captured_tiny("llama", dtype="bfloat16")
    assert not FuseDecoderChain()(copy.deepcopy(captured.graph_module)).modified
    assert not FuseDecoderChain()(non_matching_graph()).modified
