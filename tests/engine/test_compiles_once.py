"""A lazily compiling backend compiles each graph at load and never again while generating.

Inductor's guards check which kind of tensor every graph input is (inference-mode or not); a
warm-up on one kind and a runtime passing the other compiled every graph a second time on the
first real call, which on SmolLM2 doubled an engine's compile time (70 s more per engine)."""

from __future__ import annotations

import pytest
import torch._dynamo.utils as dynamo_utils

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.testing.checkpoints import sample_calibration_text, varied_prompts

TRAIN = ["train_steps=10", "train_seq_len=32", "eval_sequences=2", "eval_every=5"]


def _compiled_graphs() -> int:
    return dynamo_utils.counters["stats"]["unique_graphs"]


# kangaroo keeps a buffer of exit states built with its runtime and passes views of it as a graph input
@pytest.mark.parametrize("method", ["none", "kangaroo"])
def test_an_inductor_engine_compiles_nothing_while_generating(checkpoints, tmp_path, method, one_thread):
    target = checkpoints("llama")[0]
    settings = [*TRAIN, f"calib_data={sample_calibration_text(target, tmp_path / 'calib.txt', sequences=16)}"] \
        if method == "kangaroo" else []
    compile_engine(CompileRequest(model=str(target), method=method, output=tmp_path / "engine", backend="inductor",
                                  max_seq_len=128, settings=settings))
    before = _compiled_graphs()
    engine = load_engine(tmp_path / "engine")
    loaded = _compiled_graphs()
    for ids in varied_prompts(3, 96, seed=1):
        engine.generate_ids(ids, 20)
    assert loaded > before, "the load compiled nothing: the test no longer measures the warm-up"
    assert _compiled_graphs() == loaded, "a graph compiled again while generating"
