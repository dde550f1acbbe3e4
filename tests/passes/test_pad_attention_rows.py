"""pad_attention_rows: on a graph whose every linear is quantized, each attention call runs at
least `rows` query rows and returns the real ones, so a call of any row count up to `rows`
computes what one-row calls compute; a graph with a linear left is left alone."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.contract.infrastructure import infrastructure_passes
from specc.graph.nodes import PADDED_ROWS, attention_nodes, rows_computed_alike
from specc.passes.manager import run_passes
from specc.passes.pad_attention_rows import PadAttentionRows
from specc.passes.quantize_linear_weights import QuantizeLinearWeights
from specc.quantize.schemes import parse_scheme
from specc.testing.checkpoints import captured_tiny, run_cached_steps


@pytest.fixture(scope="module")
def graphs():
    _, captured = captured_tiny("llama")
    full, _ = run_passes("target", captured.graph_module, infrastructure_passes())
    quantized, _ = run_passes("target", copy.deepcopy(full), [QuantizeLinearWeights(parse_scheme("int8"))])
    return full, quantized, captured.architecture


def test_attention_runs_the_padded_rows_and_returns_the_real_ones(graphs):
    _, quantized, arch = graphs
    padded, records = run_passes("target", copy.deepcopy(quantized), [PadAttentionRows(4)])
    assert records[0].modified and all(n.meta[PADDED_ROWS] == 4 for n in attention_nodes(padded.graph))
    assert rows_computed_alike(padded) == 4 and rows_computed_alike(quantized) is None
    ids = torch.randint(0, arch.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    for chunks in ([(0, 8), (8, 9), (9, 11), (11, 12)], [(0, 12)]):
        torch.testing.assert_close(run_cached_steps(padded, ids, chunks, arch),
                                   run_cached_steps(quantized, ids, chunks, arch), rtol=1e-5, atol=1e-5)
    assert not PadAttentionRows(4)(padded).modified


def test_a_graph_with_a_linear_left_is_left_alone(graphs):
    full, _, _ = graphs
    assert not PadAttentionRows(4)(copy.deepcopy(full)).modified
    assert rows_computed_alike(full) is None
