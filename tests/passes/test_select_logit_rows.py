"""select_logit_rows: the graph computes logits for the rows its `logit_rows` input names,
equal to those rows of every row's logits; graphs without an LM head are left alone."""

from __future__ import annotations

import copy

import pytest
import torch

from specc.contract.infrastructure import infrastructure_passes
from specc.graph.signature import read_signature
from specc.passes.manager import run_passes
from specc.passes.select_logit_rows import SelectLogitRows
from specc.testing.checkpoints import FAMILIES, captured_tiny, empty_caches, non_matching_graph, run_cached_steps


@pytest.fixture(scope="module")
def decoding_graphs():
    graphs = {}
    for family in FAMILIES:
        _, captured = captured_tiny(family)
        gm, _ = run_passes("target", captured.graph_module, infrastructure_passes())
        graphs[family] = gm, captured.architecture
    return graphs


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_of_the_rows_asked_for_are_those_rows_of_every_rows_logits(decoding_graphs, family):
    full, arch = decoding_graphs[family]
    selecting, records = run_passes("target", copy.deepcopy(full), [SelectLogitRows()])
    ids = torch.randint(0, arch.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    every_row = run_cached_steps(full, ids, [(0, 9)], arch)
    for rows in ([8], [0, 3, 8], list(range(9))):
        got = run_cached_steps(selecting, ids, [(0, 9)], arch, torch.tensor(rows))
        torch.testing.assert_close(got, every_row[:, rows], rtol=1e-5, atol=1e-5)
    assert records[0].added_inputs == ["logit_rows"]
    signature = read_signature(selecting)
    assert signature.inputs[-1].role == "logit_rows" and signature.inputs[-1].shape == ("r",)
    assert signature.outputs[0].shape == (1, "r", "vocab")


def test_the_cache_is_written_for_every_row_whatever_rows_are_asked(decoding_graphs):
    full, arch = decoding_graphs["llama"]
    selecting, _ = run_passes("target", copy.deepcopy(full), [SelectLogitRows()])
    ids = torch.randint(0, arch.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    want = run_cached_steps(full, ids, [(0, 6), (6, 9)], arch)
    caches = empty_caches(arch)
    prompt = run_cached_steps(selecting, ids, [(0, 6)], arch, torch.tensor([5]), caches=caches)
    after = run_cached_steps(selecting, ids, [(6, 9)], arch, torch.arange(3), caches=caches)
    torch.testing.assert_close(prompt[0, 0], want[0, 5], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after, want[:, 6:], rtol=1e-5, atol=1e-5)


def test_idempotent_and_leaves_graphs_without_a_head_alone(decoding_graphs):
    full, _ = decoding_graphs["llama"]
    once = SelectLogitRows()(copy.deepcopy(full)).graph_module
    assert not SelectLogitRows()(once).modified
    assert not SelectLogitRows()(non_matching_graph()).modified


def test_an_engine_prefill_asks_for_its_last_row_and_steps_for_every_row(checkpoints, tmp_path):
    from specc.compiler import CompileRequest, compile_engine
    from specc.engine.loaded import load_engine
    from specc.testing.checkpoints import hf_greedy

    target, _ = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "e", max_seq_len=96))
    engine = load_engine(tmp_path / "e")
    model = engine.runtime.target
    asked, forward = [], model.forward_fn
    model.forward_fn = lambda *args: asked.append((args[0].shape[1], args[-1].tolist())) or forward(*args)
    prompt = list(range(3, 14))
    assert engine.generate_ids(prompt, 5).token_ids == hf_greedy(target, [prompt], 5)[0]
    assert asked[0] == (11, [10]) and all(rows == list(range(q)) for q, rows in asked[1:]) and len(asked) > 1
    with torch.inference_mode():
        last = model.prefill(torch.tensor(prompt), 0).logits
        every = model.run_chunk(torch.tensor(prompt), 0).logits
    assert last.shape == (1, every.shape[1]) and every.shape[0] == len(prompt)
    torch.testing.assert_close(last[0], every[-1], rtol=1e-5, atol=1e-5)
