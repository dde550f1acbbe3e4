"""use_row_attention: on a graph whose every linear is one of specc's blocked kernels, each masked
attention call runs through `specc.row_attention`, computing what PyTorch's attention computes, and
the graph computes rows alike without padding; a graph with a linear left takes the kernel too
(every graph of an engine must round attention alike) but still runs padded."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.contract.infrastructure import infrastructure_passes
from specc.graph.nodes import PADDED_ROWS, attention_nodes, rows_computed_alike
from specc.passes.manager import run_passes
from specc.passes.pad_attention_rows import PadAttentionRows
from specc.passes.quantize_linear_weights import QuantizeLinearWeights
from specc.passes.use_row_attention import ROW_ATTENTION, UseRowAttention
from specc.quantize.schemes import parse_scheme
from specc.testing.checkpoints import captured_tiny, empty_caches, run_cached_steps


@pytest.fixture(scope="module")
def graphs():
    _, captured = captured_tiny("llama", dtype="bfloat16")
    full, _ = run_passes("target", captured.graph_module, infrastructure_passes())
    quantized, _ = run_passes("target", copy.deepcopy(full), [QuantizeLinearWeights(parse_scheme("q8"))])
    return full, quantized, captured.architecture


def _caches(arch) -> list:
    return [cache.to(torch.bfloat16) for cache in empty_caches(arch)]


def _row_attention_nodes(gm):
    return [n for n in gm.graph.nodes if n.target == ROW_ATTENTION]


def test_attention_runs_row_by_row_and_computes_what_sdpa_computes(graphs):
    _, quantized, arch = graphs
    rewritten, records = run_passes("target", copy.deepcopy(quantized), [UseRowAttention(4), PadAttentionRows(4)])
    assert records[0].modified and not records[1].modified, "nothing is left to pad"
    assert not attention_nodes(rewritten.graph) and len(_row_attention_nodes(rewritten)) == arch.num_layers
    assert all(n.meta[PADDED_ROWS] == 4 for n in _row_attention_nodes(rewritten))
    assert rows_computed_alike(rewritten) == 4
    ids = torch.randint(0, arch.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    chunks = [(0, 8), (8, 9), (9, 11), (11, 12)]
    got, want = (run_cached_steps(gm, ids, chunks, arch, caches=_caches(arch)).float() for gm in (rewritten, quantized))
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * want.abs().amax().item())
    assert not UseRowAttention(4)(rewritten).modified


def test_in_bfloat16_a_call_of_several_rows_computes_the_bits_of_one_row_steps(graphs):
    _, quantized, arch = graphs
    rewritten, _ = run_passes("target", copy.deepcopy(quantized), [UseRowAttention(4)])
    ids = torch.randint(0, arch.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    stepwise = run_cached_steps(rewritten, ids, [(0, 8), *((i, i + 1) for i in range(8, 12))], arch,
                                caches=_caches(arch))
    together = run_cached_steps(rewritten, ids, [(0, 8), (8, 12)], arch, caches=_caches(arch))
    assert torch.equal(stepwise[:, 8:], together[:, 8:])


def test_a_graph_with_a_linear_left_takes_the_kernel_too_but_is_not_alike(graphs):
    full, _, _ = graphs
    rewritten, records = run_passes("target", copy.deepcopy(full), [UseRowAttention(4)])
    assert records[0].modified and not attention_nodes(rewritten.graph)
    assert rows_computed_alike(rewritten) is None   # its bfloat16 linears still round by the row count
