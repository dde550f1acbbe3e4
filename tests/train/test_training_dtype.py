"""Compile-time training runs on a program of its own, in float32 where that multiplies
faster than the engine's reduced precision; the engine's program is built afterwards with
every pass training's choices call for, and the trained weights installed in its dtype."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specc.compiler import CompileRequest, build_program, compile_engine, install_weights, training_context
from specc.train import dtype as train_dtype
from specc.capture.load import load_model
from specc.engine.loaded import load_engine
from specc.errors import SpeccError
from specc.contract import descriptor
from specc.contract.descriptor import get_method
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY
from specc.testing.checkpoints import sample_calibration_text

TRAIN = ["train_steps=4", "train_seq_len=32", "eval_sequences=2", "eval_every=4", "draft_vocab_size=40"]


@pytest.fixture
def float32_is_faster(monkeypatch):
    """A CPU whose float32 products beat bfloat16 ones (bfloat16 without AMX)."""
    monkeypatch.setattr(train_dtype, "matmul_seconds",
                        lambda dtypes, hidden, device="cpu": {d: float(d != "float32") for d in dtypes})


@pytest.fixture
def recorded_training(monkeypatch):
    """Wrap kangaroo's training step: record the dtype of the program it trains on."""
    method = get_method("kangaroo")
    seen = []

    def train(context, config, tokenizer):
        seen.append(next(context.program.graphs["adapter"].module.parameters()).dtype)
        return method.train(context, config, tokenizer)

    monkeypatch.setitem(descriptor._REGISTRY, "kangaroo", dataclasses.replace(method, train=train))
    return seen


def compile_kangaroo(target, output, dtype: str):
    calib = sample_calibration_text(target, output.parent / f"calib-{dtype}.txt", sequences=16)
    return compile_engine(CompileRequest(model=str(target), method="kangaroo", output=output, dtype=dtype,
                                         max_seq_len=96, settings=[*TRAIN, f"calib_data={calib}"]))


def test_bfloat16_engines_train_in_float32_and_store_bfloat16_weights(checkpoints, tmp_path, recorded_training,
                                                                     float32_is_faster):
    target = checkpoints("llama")[0]
    report = compile_kangaroo(target, tmp_path / "engine", "bfloat16")
    assert recorded_training == [torch.float32]
    assert report["training"]["dtype"] == "float32" and report["training"]["seconds"] > 0
    added = added_weights(tmp_path / "engine")
    assert any(name.startswith("adapter.") for name in added)
    assert all(t.dtype == torch.bfloat16 for t in added.values())
    load_engine(tmp_path / "engine")
    # The head reduction training chose is a recorded pass of the engine's graph, not a side effect.
    assert [p["pass_name"] for p in report["passes"] if p["graph"] == "adapter"][-2:] == ["reduce_draft_vocabulary",
                                                                                          "select_logit_rows"]


def test_float32_weights_match_a_float32_trained_engine_cast(checkpoints, tmp_path, float32_is_faster):
    """The bfloat16 engine's trained tensors are the float32 engine's, rounded once."""
    target = checkpoints("llama")[0]
    compile_kangaroo(target, tmp_path / "f32", "float32")
    compile_kangaroo(target, tmp_path / "bf16", "bfloat16")
    f32, bf16 = added_weights(tmp_path / "f32"), added_weights(tmp_path / "bf16")
    assert f32.keys() == bf16.keys()
    for name, tensor in f32.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor.to(torch.bfloat16), bf16[name]), name


def added_weights(engine) -> dict:
    from safetensors.torch import load_file

    from specc.engine.save import ADDED_WEIGHTS

    return load_file(str(engine / ADDED_WEIGHTS))


def test_training_runs_in_whichever_dtype_multiplies_faster_here(monkeypatch):
    timings = {"bfloat16": 2.0, "float32": 1.0}
    monkeypatch.setattr(train_dtype, "matmul_seconds",
                        lambda dtypes, hidden, device="cpu": {d: timings[d] for d in dtypes})
    assert train_dtype.training_dtype("bfloat16", 64) == "float32"
    timings["bfloat16"] = 0.5   # a CPU with bfloat16 matrix units (AMX)
    assert train_dtype.training_dtype("bfloat16", 64) == "bfloat16"
    assert train_dtype.training_dtype("float32", 64) == "float32"
    measured = train_dtype._time_matmul(torch.float32, 32)
    assert 0 < measured < 1


def test_installing_a_weight_no_graph_reads_or_of_another_shape_is_an_error(checkpoints):
    method = get_method("kangaroo")
    config = method.config_class.from_assignments([])
    program = build_program({"target": load_model(checkpoints("llama")[0])}, method, config, 64)
    name, tensor = next((n, p) for n, p in program.graphs["adapter"].module.named_parameters()
                        if n.startswith("adapter."))
    with pytest.raises(SpeccError, match="no graph of the program reads"):
        install_weights(program, {"nowhere.weight": torch.zeros(2)})
    with pytest.raises(SpeccError, match="has shape"):
        install_weights(program, {name: torch.zeros(*tensor.shape, 2)})
    installed = install_weights(program, {name: torch.full_like(tensor, 0.5)})
    assert torch.equal(program.graphs["adapter"].module.get_parameter(name), installed[name])


def test_training_asks_the_compiler_for_graphs_and_leaves_its_program_alone(checkpoints):
    """Every graph training runs is built by `build_program`, from the captured weights, with its
    passes recorded; a rebuild for a choice (here a reduced head) is a program of its own."""
    method = get_method("kangaroo")
    config = method.config_class.from_assignments([])
    context = training_context({"target": load_model(checkpoints("llama")[0])}, method, config, 64,
                               engine_backend="inductor")
    assert context.engine_backend == "inductor" and context.engine_device == torch.device("cpu")
    reduced = context.build(config, {DRAFT_VOCABULARY_KEY: [0, 1, 2]}, names=("adapter",))
    assert list(reduced.graphs) == ["adapter"]
    assert [r.pass_name for r in reduced.pass_records][-1] == "reduce_draft_vocabulary"
    assert "reduce_draft_vocabulary" not in [r.pass_name for r in context.program.pass_records]
    original, rebuilt = (tensors(context.program.graphs["shallow"].module), tensors(reduced.graphs["adapter"].module))
    shared = original.keys() & rebuilt.keys()
    assert shared and all(original[name] is rebuilt[name] for name in shared)


def tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict([*module.named_parameters(), *module.named_buffers()])
