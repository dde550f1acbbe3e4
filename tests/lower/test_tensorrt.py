"""`--backend tensorrt`: without the tensorrt package or a CUDA device, compile
and load refuse up front with one line naming what is missing and pointing at
`--backend onnx`. The build path needs both and is skipped elsewhere."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from specc.compiler import CompileRequest, compile_engine
from specc.errors import UsageError
from specc.lower.registry import get_backend

TENSORRT_RUNS_HERE = importlib.util.find_spec("tensorrt") is not None and torch.cuda.is_available()


def test_compile_refuses_before_any_work(checkpoints, tmp_path):
    if TENSORRT_RUNS_HERE:
        pytest.skip("tensorrt and a CUDA device are present: nothing to refuse")
    output = tmp_path / "engine"
    with pytest.raises(UsageError) as refused:
        compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="none", output=output,
                                      backend="tensorrt", max_seq_len=96))
    message = str(refused.value)
    assert message.startswith("backend 'tensorrt' needs ") and "--backend onnx" in message
    assert "\n" not in message
    assert not output.exists()


def test_load_refuses(tmp_path):
    if TENSORRT_RUNS_HERE:
        pytest.skip("tensorrt and a CUDA device are present: nothing to refuse")
    with pytest.raises(UsageError, match="backend 'tensorrt' needs .*--backend onnx"):
        get_backend("tensorrt").load(None, tmp_path, {"backend": "tensorrt"})


def test_refusal_names_the_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)   # makes `import tensorrt` fail
    with pytest.raises(UsageError, match="needs the tensorrt package"):
        get_backend("tensorrt").check_available()


def test_refusal_names_the_missing_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match=r"needs a CUDA device \(torch.cuda.is_available\(\) is False\)"):
        get_backend("tensorrt").check_available()


@pytest.mark.gpu
@pytest.mark.skipif(not TENSORRT_RUNS_HERE, reason="needs the tensorrt package and a CUDA device "
                                                   "(the build path has never run: written without either)")
def test_none_matches_hf_greedy(checkpoints, tmp_path):
    from specc.engine.loaded import load_engine
    from specc.testing.checkpoints import assert_matches_hf_greedy, varied_prompts

    target, _ = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "engine",
                                  backend="tensorrt", max_seq_len=96))
    assert (tmp_path / "engine" / "compiled" / "target.plan").is_file()
    engine = load_engine(tmp_path / "engine")
    assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, 24), target, varied_prompts(20, 96, seed=11), 24)
