"""reduce_draft_vocabulary: the draft graph's logits are the full head's logits
of the chosen rows, in their order; the target head is untouched."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.errors import SpeccError
from specc.graph.signature import read_signature
from specc.contract.infrastructure import infrastructure_passes
from specc.passes.manager import run_passes
from specc.passes.reduce_draft_vocabulary import DraftVocabularyConfig, ReduceDraftVocabulary
from specc.testing.checkpoints import captured_tiny, non_matching_graph, run_cached_steps

IDS = (7, 0, 31, 2, 50, 11)


@pytest.fixture(scope="module")
def decoding_graph():
    _, captured = captured_tiny("llama")
    gm, _ = run_passes("target", captured.graph_module, infrastructure_passes())
    return gm, captured.architecture


def test_logits_are_the_chosen_rows_of_the_full_head(decoding_graph):
    full, arch = decoding_graph
    reduced, records = run_passes("draft", copy.deepcopy(full), [ReduceDraftVocabulary(DraftVocabularyConfig(IDS))])
    ids = torch.randint(0, arch.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    want = run_cached_steps(full, ids, [(0, 5), (5, 9)], arch)[..., list(IDS)]
    got = run_cached_steps(reduced, ids, [(0, 5), (5, 9)], arch)
    torch.testing.assert_close(got, want)
    assert records[0].added_parameters == ["draft_head.weight"]
    assert read_signature(reduced).outputs[0].shape == (1, "q", len(IDS))
    assert read_signature(full).outputs[0].shape == (1, "q", "vocab"), "the source graph was modified"


def test_idempotent(decoding_graph):
    full, _ = decoding_graph
    reduce = ReduceDraftVocabulary(DraftVocabularyConfig(IDS))
    once = reduce(copy.deepcopy(full)).graph_module
    assert not reduce(once).modified


def test_refuses_bad_ids_and_leaves_graphs_without_a_head_alone(decoding_graph):
    full, arch = decoding_graph
    with pytest.raises(SpeccError, match="ids must lie in"):
        ReduceDraftVocabulary(DraftVocabularyConfig((0, arch.vocab_size)))(copy.deepcopy(full))
    assert not ReduceDraftVocabulary(DraftVocabularyConfig(IDS))(non_matching_graph()).modified
