"""`--backend onnx`: engines exported to ONNX and run by onnxruntime reproduce
Hugging Face greedy decoding for every family and every lossless method;
packaging is reported in the manifest; custom operators and a missing
onnxruntime fail with errors that say what to do."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.fx as fx

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.errors import SpeccError, UsageError
from specc.engine.inspect_engine import inspect_engine
from specc.lower.onnx import check_exportable_ops
from specc.lower.onnx_session import OnnxSessionGraph
from specc.testing.checkpoints import FAMILIES, assert_matches_hf_greedy, varied_prompts

ort = pytest.importorskip("onnxruntime", reason="the onnx backend needs pip install 'specc[onnx]'")

MAX_NEW_TOKENS = 24   # the tiny checkpoints' EOS was picked for 24 new tokens
NUM_PROMPTS = 20


def compile_onnx(checkpoint: Path, output: Path, method: str = "none", settings=()) -> dict:
    return compile_engine(CompileRequest(model=str(checkpoint), method=method, output=output, backend="onnx",
                                         max_seq_len=96, settings=list(settings)))


def assert_identical(engine, checkpoint: Path) -> list:
    return assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), checkpoint,
                                    varied_prompts(NUM_PROMPTS, 96, seed=11), MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def none_engines(checkpoints, tmp_path_factory):
    """family -> (engine directory, compile report) of a `none` engine, compiled once."""
    built = {}

    def get(family: str):
        if family not in built:
            output = tmp_path_factory.mktemp(f"onnx-none-{family}") / "engine"
            built[family] = output, compile_onnx(checkpoints(family)[0], output)
        return built[family]

    return get




@pytest.mark.parametrize("family", FAMILIES)
def test_none_matches_hf_greedy(checkpoints, none_engines, family):
    path, report = none_engines(family)
    engine = load_engine(path)
    assert isinstance(engine.context.graphs["target"], OnnxSessionGraph)
    lowered = report["lowered"]["target"]
    assert lowered["seconds"] > 0 and lowered["files"]["target.onnx"] > 10_000
    assert_identical(engine, checkpoints(family)[0])


def test_torch_runs_one_thread_while_an_onnx_engine_generates(none_engines):
    """Between session calls torch does only small ops; its OpenMP threads would fight
    onnxruntime's pool for the cores. Afterwards, and between streamed rounds (the
    caller's own code), torch's own thread count is back."""
    engine = load_engine(none_engines("llama")[0])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        engine.generate_ids([5, 6, 7], 4, on_tokens=lambda ids: seen.append(torch.get_num_threads()))
        assert seen and set(seen) == {1}
        target, during_rounds = engine.runtime.target, []
        step = target.prefill
        target.prefill = lambda *args: during_rounds.append(torch.get_num_threads()) or step(*args)
        streamed = [torch.get_num_threads() for _ in engine.rounds([5, 6, 7], 4)]
        assert set(streamed) == {2}, "the caller runs between rounds with its own threads"
        assert during_rounds and set(during_rounds) == {1}
        abandoned = engine.rounds([5, 6, 7], 4)
        next(abandoned)
        assert torch.get_num_threads() == 2, "an unfinished stream leaves the caller's threads alone"
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_packaging_is_in_the_manifest_and_inspect(none_engines):
    path, _ = none_engines("llama")
    manifest = json.loads((path / "manifest.json").read_text())
    assert "compiled/target.onnx" in manifest["files"], "the ONNX graph must be checksummed"
    assert set(manifest["lowered"]) == {"target"}
    assert "lowered by onnx in" in inspect_engine(path)


def test_the_callable_has_the_graphs_call_convention(none_engines):
    """Same outputs as the FX graph, and the cache rows land where the FX graph puts them."""
    path, _ = none_engines("llama")
    onnx_engine = load_engine(path)
    eager_engine = load_engine(path, backend="eager")
    onnx_model, eager_model = onnx_engine.target, eager_engine.target
    tokens = torch.tensor([5, 9, 13, 40])
    for model in (onnx_model, eager_model):
        model.prefill(tokens, start=0)
        model.prefill(tokens[:1], start=4)
    for ours, reference in zip(onnx_model.cache.tensors, eager_model.cache.tensors):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
    slots = torch.arange(5, 7)
    mask = torch.ones(2, 7, dtype=torch.bool).tril(5)[None, None]
    ours = onnx_model.run_all(tokens[:2], slots, slots, mask)
    reference = eager_model.run_all(tokens[:2], slots, slots, mask)
    assert type(ours) is type(reference) and len(ours) == len(reference)
    torch.testing.assert_close(ours[0], reference[0], rtol=1e-4, atol=1e-4)


def test_float16_engine_matches_its_eager_graphs(checkpoints, tmp_path):
    target, _ = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "engine", backend="onnx",
                                  dtype="float16", max_seq_len=96))
    onnx_engine, eager_engine = load_engine(tmp_path / "engine"), load_engine(tmp_path / "engine", backend="eager")
    for prompt in varied_prompts(4, 96, seed=3):
        assert onnx_engine.generate_ids(prompt, 12).token_ids == eager_engine.generate_ids(prompt, 12).token_ids


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="onnxruntime-gpu runs bfloat16")
def test_bfloat16_is_refused_where_onnxruntime_cannot_run_it(checkpoints, tmp_path):
    with pytest.raises(UsageError, match="no bfloat16 kernels on the CPU.*--dtype float32 or float16"):
        compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="none", output=tmp_path / "e",
                                      backend="onnx", dtype="bfloat16", max_seq_len=96))
    assert not (tmp_path / "e").exists()


def test_draft_model_tree_matches_hf_greedy(checkpoints, tmp_path):
    target, draft = checkpoints("llama")
    compile_onnx(target, tmp_path / "engine", "draft-model",
                 ["num_draft_tokens=3", "tree_width=3", f"draft_model={draft}"])
    engine = load_engine(tmp_path / "engine")
    assert sorted(p.name for p in (tmp_path / "engine" / "compiled").iterdir()) == ["draft.onnx", "target.onnx"]
    results = assert_identical(engine, target)
    assert 0 < sum(r.stats.accepted_tokens for r in results) < sum(r.stats.drafted_tokens for r in results)


def test_kangaroo_matches_hf_greedy(checkpoints, tmp_path):
    """Three graphs with extra inputs (exit states) and extra outputs; the adapter is left
    untrained (train_steps=0): losslessness does not depend on it."""
    target, _ = checkpoints("llama")
    compile_onnx(target, tmp_path / "engine", "kangaroo", ["train_steps=0", "tree_width=3", "tree_threshold=0.9"])
    engine = load_engine(tmp_path / "engine")
    assert {p.name for p in (tmp_path / "engine" / "compiled").iterdir()} == {
        "shallow.onnx", "deep.onnx", "adapter.onnx"}
    results = assert_identical(engine, target)
    assert sum(r.stats.drafted_tokens for r in results) > 0


def test_swift_matches_hf_greedy(checkpoints, tmp_path):
    """Verification runs the exported graph (its sublayer segments inlined); while the
    search runs, the drafter runs the segments eager, writing the same caches."""
    target, _ = checkpoints("llama")
    compile_onnx(target, tmp_path / "engine", "swift", ["calib_prompts=0", "adapt=true", "context_window=8",
                                                       "max_tries_per_prompt=8"])
    engine = load_engine(tmp_path / "engine")
    assert isinstance(engine.target.forward_fn, OnnxSessionGraph)
    results = assert_identical(engine, target)
    assert sum(r.stats.accepted_tokens for r in results) > 0


@pytest.mark.shared_data
def test_swift_drafts_with_the_exported_draft_graph(checkpoints, tmp_path):
    """With the stored set (`adapt=false`) every draft step runs the exported `draft`
    graph, the target with that set cut out, writing the same onnx-shared caches."""
    target, _ = checkpoints("llama")
    compile_onnx(target, tmp_path / "engine", "swift", ["calib_prompts=0", "adapt=false", "draft_vocab_size=48"])
    engine = load_engine(tmp_path / "engine")
    assert {p.name for p in (tmp_path / "engine" / "compiled").iterdir()} == {"target.onnx", "draft.onnx"}
    assert engine.drafter.compiled.vocabulary.numel() == 48, "the draft graph's head is reduced"
    compiled = engine.drafter.compiled.model
    assert isinstance(compiled.forward_fn, OnnxSessionGraph)
    results = assert_identical(engine, target)
    assert sum(r.stats.accepted_tokens for r in results) > 0
    assert compiled.forward_passes == sum(r.stats.draft_steps for r in results) > 0
    assert engine.drafter.draft.forward_passes == 0, "no draft step ran the segments"
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:   # no torch segment runs, so torch steps aside for onnxruntime's pool as `none` does
        seen = []
        engine.generate_ids([5, 6, 7], 4, on_tokens=lambda ids: seen.append(torch.get_num_threads()))
        assert seen and set(seen) == {1}
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_swift_with_inductor_segments_matches_hf_greedy(checkpoints, tmp_path):
    """`compile_segments=true`: the drafter's segments go through the backend's segment
    compiler, which for onnx is Inductor (segments write the torch caches in place)."""
    target, _ = checkpoints("llama")
    compile_onnx(target, tmp_path / "engine", "swift", ["calib_prompts=0", "adapt=false", "compile_segments=true"])
    engine = load_engine(tmp_path / "engine")
    assert_identical(engine, target)


def test_s3d_matches_hf_greedy(checkpoints, tmp_path):
    """Two graphs sharing one KV cache: the draft (middle layers cut, mask-token input, LoRA)
    and the untouched target; the draft-only parameters stay untrained (train_steps=0)."""
    target, _ = checkpoints("llama")
    compile_onnx(target, tmp_path / "engine", "s3d", ["train_steps=0", "tree_width=2", "tree_threshold=0.9"])
    engine = load_engine(tmp_path / "engine")
    assert {p.name for p in (tmp_path / "engine" / "compiled").iterdir()} == {"target.onnx", "draft.onnx"}
    results = assert_identical(engine, target)
    assert sum(r.stats.drafted_tokens for r in results) > 0


@pytest.mark.slow
def test_specee_lossless_matches_hf_greedy(checkpoints, tmp_path):
    """SpecEE's verify and draft-head graphs are exported; its layer stepper runs the
    layerwise graph's segments (eager); exits forced by a low threshold."""
    target, _ = checkpoints("llama")
    settings = ["train_steps=5", "train_windows=4", "predictor_windows=2", "eval_sequences=2", "predictor_epochs=2",
                "train_seq_len=32", "exit_threshold=0.001", "offline_layers=64"]
    compile_onnx(target, tmp_path / "engine", "specee", settings)
    engine = load_engine(tmp_path / "engine")
    results = assert_identical(engine, target)
    assert sum(r.stats.drafted_tokens for r in results) > 0


def test_prompt_lookup_matches_hf_greedy(checkpoints, tmp_path, prompt_lookup_method):
    target, _ = checkpoints("llama")
    compile_onnx(target, tmp_path / "engine", "prompt-lookup", ["max_ngram=2", "tree_width=3"])
    results = assert_identical(load_engine(tmp_path / "engine"), target)
    assert sum(r.stats.accepted_tokens for r in results) > 0


@torch.library.custom_op("specc_test::scale_by_two", mutates_args=())
def scale_by_two(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@scale_by_two.register_fake
def _(x):
    return torch.empty_like(x)


def graph_calling_custom_op() -> fx.GraphModule:
    class ScaleThenShift(torch.nn.Module):
        def forward(self, x):
            return scale_by_two(x) + 1

    exported = torch.export.export(ScaleThenShift(), (torch.ones(3),)).module()
    return fx.GraphModule(exported, exported.graph)


SHARED_POOL_PROBE = """
import onnxruntime, torch
from specc.lower.onnx_session import session_options
torch.set_num_threads(1)
single = session_options(onnxruntime)
torch.set_num_threads(2)
first, second = session_options(onnxruntime), session_options(onnxruntime)
torch.set_num_threads(1)
after = session_options(onnxruntime)
print(single.use_per_session_threads, single.intra_op_num_threads,
      [o.use_per_session_threads for o in (first, second, after)])
"""


def test_sessions_share_one_thread_pool_once_threads_exceed_one():
    """Per-session pools keep spinning after a run, so graphs called in turn (draft, then
    verify) ran beside each other's idle threads; with more than one thread every session
    shares one pool, and keeps it (onnxruntime refuses per-session pools after that)."""
    out = subprocess.run([sys.executable, "-c", SHARED_POOL_PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "True 1 [False, False, False]"


def test_a_custom_operator_without_translation_is_named():
    with pytest.raises(SpeccError, match="custom operator specc_test::scale_by_two, which has no ONNX translation"):
        check_exportable_ops(graph_calling_custom_op())


def test_a_custom_operator_with_a_translation_passes(monkeypatch):
    from specc.lower import onnx as onnx_backend

    monkeypatch.setitem(onnx_backend.ONNX_TRANSLATIONS, torch.ops.specc_test.scale_by_two.default, lambda x: x)
    check_exportable_ops(graph_calling_custom_op())


def test_missing_onnxruntime_is_a_one_line_usage_error(checkpoints, none_engines, tmp_path, monkeypatch):
    path, _ = none_engines("llama")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)   # makes `import onnxruntime` fail
    message = "backend 'onnx' needs onnxruntime: pip install 'specc[onnx]'"
    with pytest.raises(UsageError, match=re.escape(message)):
        load_engine(path)
    with pytest.raises(UsageError, match=re.escape(message)):
        compile_onnx(checkpoints("llama")[0], tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_sessions_run_on_the_engines_device_only():
    """A CPU engine's session never runs on the CUDA provider (its inputs would be staged through
    the GPU on every call); a CUDA engine's runs on its own GPU, the CPU provider as fallback."""
    from types import SimpleNamespace

    from specc.lower.onnx_session import session_providers

    with_gpu = SimpleNamespace(get_available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    cpu_only = SimpleNamespace(get_available_providers=lambda: ["CPUExecutionProvider"])
    assert session_providers(with_gpu, torch.device("cpu")) == ["CPUExecutionProvider"]
    assert session_providers(with_gpu, torch.device("cuda", 1)) == [
        ("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    assert session_providers(with_gpu, torch.device("cuda"))[0] == ("CUDAExecutionProvider", {"device_id": 0})
    assert session_providers(cpu_only, torch.device("cpu")) == ["CPUExecutionProvider"]
