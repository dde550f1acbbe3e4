"""AOTInductor packages each graph twice, tuned for few and for many query rows, and a call
runs the package for its row count; both give the same tokens as Hugging Face greedy."""

from __future__ import annotations

import pytest
import torch

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.lower.aoti import NARROW_MAX_ROWS, RowDispatch
from specc.lower.row_padding import PaddedRows, RowPadding
from specc.testing.checkpoints import assert_matches_hf_greedy, varied_prompts


def test_calls_with_many_rows_run_the_wide_package():
    calls = []
    dispatch = RowDispatch(lambda *a: calls.append("narrow"), lambda *a: calls.append("wide"), 1, 1)
    for rows in (1, NARROW_MAX_ROWS, NARROW_MAX_ROWS + 1, 40):
        dispatch(torch.zeros(7), torch.zeros(1, rows))
    assert calls == ["narrow", "narrow", "wide", "wide"]


@pytest.mark.slow
def test_both_packages_are_built_and_generate_like_hf_greedy(checkpoints, tmp_path, one_thread):
    target = checkpoints("llama")[0]
    compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "e", backend="aoti",
                                  max_seq_len=96))
    assert sorted(p.name for p in (tmp_path / "e" / "compiled").iterdir()) == ["target.pt2", "target.wide.pt2"]
    engine = load_engine(tmp_path / "e")
    forward = engine.context.graphs["target"]
    assert isinstance(forward, RowDispatch)
    rows = []
    narrow, wide = forward.narrow, forward.wide
    forward.narrow = lambda *a: rows.append("narrow") or narrow(*a)
    forward.wide = lambda *a: rows.append("wide") or wide(*a)
    prompts = [p for p in varied_prompts(16, 96, seed=2) if len(p) > NARROW_MAX_ROWS][:4]
    assert len(prompts) == 4
    results = assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, 12), target, prompts, 12)
    # Each prompt is one wide call; each later token one narrow step.
    assert rows.count("wide") == len(prompts)
    assert rows.count("narrow") == sum(len(r.token_ids) - 1 for r in results) > 0


def test_calls_of_fewer_rows_run_padded_with_their_last_row():
    """bfloat16 graphs: inputs with a q axis grow to the padding's rows by repeating the last
    row, outputs are cut back to the real rows; a call with that many rows runs as it is."""
    seen = []

    def forward(tokens, mask, cache):
        seen.append((tokens.tolist(), tuple(mask.shape), tuple(cache.shape)))
        return [tokens.float() * 2, cache.sum()[None]]

    padding = RowPadding(rows=4, inputs=((0, 1), (1, 2)), outputs=((0, 1),))
    dispatch = PaddedRows(forward, padding)
    logits, total = dispatch(torch.tensor([[7]]), torch.ones(1, 1, 1, 5, dtype=torch.bool), torch.ones(3, 4))
    assert seen == [([[7, 7, 7, 7]], (1, 1, 4, 5), (3, 4))]
    assert logits.tolist() == [[14.0]] and float(total) == 12.0
    logits, _ = dispatch(torch.tensor([[7, 8, 9]]), torch.ones(1, 1, 3, 5, dtype=torch.bool), torch.ones(3, 4))
    assert seen[-1][0] == [[7, 8, 9, 9]] and logits.tolist() == [[14.0, 16.0, 18.0]]
    dispatch(torch.tensor([[7, 8, 9, 10]]), torch.ones(1, 1, 4, 5, dtype=torch.bool), torch.ones(3, 4))
    assert seen[-1][0] == [[7, 8, 9, 10]]   # four rows run as they are


def test_logit_rows_pad_with_the_query_rows_and_a_chunk_asking_for_its_last_row_runs_as_it_is():
    """The LM head of a padded call runs over as many rows as the rest of the graph (so a
    verification rounds each row as a decode step does); a longer chunk is not padded."""
    seen = []

    def forward(tokens, rows):
        seen.append((tokens.tolist(), rows.tolist()))
        return [tokens[:, rows].float()]

    padding = RowPadding(rows=4, inputs=((0, 1),), outputs=(), logit_inputs=((1, 0),), logit_outputs=((0, 1),))
    dispatch = PaddedRows(forward, padding)
    (logits,) = dispatch(torch.tensor([[7, 8]]), torch.arange(2))
    assert seen[-1] == ([[7, 8, 8, 8]], [0, 1, 1, 1]) and logits.tolist() == [[7.0, 8.0]]
    (logits,) = dispatch(torch.tensor([[7, 8]]), torch.tensor([1]))
    assert seen[-1] == ([[7, 8, 8, 8]], [1, 1, 1, 1]) and logits.tolist() == [[8.0]]
    (logits,) = dispatch(torch.tensor([[7, 8, 9, 10, 11]]), torch.tensor([4]))
    assert seen[-1] == ([[7, 8, 9, 10, 11]], [4]) and logits.tolist() == [[11.0]]


def test_packages_are_built_for_the_idle_machine_threads_not_the_compile_threads(monkeypatch, tmp_path,
                                                                                one_thread):
    """Inductor bakes the packaging threads into its GEMM kernels: a compile run with one
    thread must not leave an engine whose matrix products never run in parallel."""
    import types

    import specc.lower.aoti as aoti

    seen = {}
    monkeypatch.setattr(aoti, "idle_machine_threads", lambda: 3)
    monkeypatch.setattr(aoti, "example_inputs", lambda *a, **k: [torch.zeros(1, 2)])
    monkeypatch.setattr(aoti, "dynamic_dims", lambda *a: [None])
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: "exported")
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package",
                        lambda exported, package_path: seen.update(
                            threads=torch.get_num_threads(),
                            min_chunk=torch._inductor.config.cpp.min_chunk_size))
    target = types.SimpleNamespace(name="target", module=torch.nn.Linear(2, 2), signature=None, sizes=None,
                                   dtype=torch.float32, max_seq_len=8, device=torch.device("cpu"))
    assert aoti._package(target, tmp_path / "target.pt2", rows=3) == "target.pt2"
    assert seen == {"threads": 3, "min_chunk": aoti.MIN_CHUNK_PER_THREAD}   # small kernels stay on one thread
    assert torch.get_num_threads() == 1
    assert torch._inductor.config.cpp.min_chunk_size != aoti.MIN_CHUNK_PER_THREAD   # only while packaging
