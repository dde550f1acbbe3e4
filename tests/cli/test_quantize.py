"""`specc compile --quantize`: refusals before any work, the summary line, the manifest's record,
`specc inspect`, and `specc run` on the engine."""

from __future__ import annotations

import json

import pytest

from specc.cli.main import main
from specc.testing.checkpoints import build_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_checkpoint("llama", tmp_path_factory.mktemp("quantize") / "model")


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("options, words", [
    (["--quantize", "int4"], "needs --dtype bfloat16"),
    (["--quantize", "int4", "--dtype", "bfloat16", "--backend", "onnx"], "runs on the eager, inductor, aoti backends"),
    (["--quantize", "int3", "--dtype", "bfloat16"], "unknown quantization 'int3'; choose from: q4, q6, q8, int8, int4"),
    (["--quantize-draft", "q4"], "--quantize-draft q4 needs --dtype bfloat16"),
    (["--quantize-draft", "q4", "--quantize", "q8", "--dtype", "bfloat16", "--method", "swift"],
     "method 'swift' drafts with the target's own weights, which --quantize packs already"),
    (["--quantize-draft", "q4", "--dtype", "bfloat16"], "--quantize-draft packs the weights of the graphs that only draft, "
                                                        "and method 'none' (as configured) has none"),
])
def test_unservable_requests_are_refused_before_any_work(checkpoint, tmp_path, capsys, options, words):
    code, _, err = run_cli(capsys, "compile", checkpoint, "--method", "none", "-o", tmp_path / "e", *options)
    assert code == 2 and words in err
    assert not (tmp_path / "e").exists()


def test_a_quantized_engine_says_what_it_packed_and_runs(checkpoint, tmp_path, capsys):
    engine = tmp_path / "e"
    code, out, _ = run_cli(capsys, "compile", checkpoint, "--method", "none", "--dtype", "bfloat16",
                           "--quantize", "int8", "--max-seq-len", "64", "-o", engine)
    assert code == 0 and "quantized int8 (per output channel): linear weights 22 int8" in out
    record = json.loads((engine / "manifest.json").read_text())["quantization"]
    assert record["scheme"] == "int8" and record["linear_weights"] == {"int8": 22}
    assert record["bytes"]["quantized"] < 0.6 * record["bytes"]["unquantized"]
    assert 0 <= record["quality"]["top1_agreement"] <= 1 and record["quality"]["tokens"] > 0
    code, out, _ = run_cli(capsys, "inspect", engine)
    assert code == 0 and "quantized int8" in out and "quantize_linear_weights" in out
    code, out, _ = run_cli(capsys, "run", engine, "--prompt", "w5 w6 w7", "--max-new-tokens", "8", "--json")
    assert code == 0 and len(json.loads(out)["token_ids"]) == 8


def test_a_q4_engine_records_its_q4_body_and_q8_head(checkpoint, tmp_path, capsys):
    engine = tmp_path / "e"
    code, out, _ = run_cli(capsys, "compile", checkpoint, "--method", "none", "--dtype", "bfloat16",
                           "--quantize", "q4", "--max-seq-len", "64", "-o", engine)
    record = json.loads((engine / "manifest.json").read_text())["quantization"]
    assert code == 0 and "quantized q4 (blocks of 32 inputs (8-bit scale and min under an fp16 pair per 8 blocks))" in out
    # 3 layers of q/k/v (stacked), o, gate/up (stacked), down; the head
    assert record["linear_weights"] == {"q4": 12, "q8": 1} and record["activations"].startswith("int8")
    assert record["bytes"]["quantized"] < 0.5 * record["bytes"]["unquantized"]
    code, out, _ = run_cli(capsys, "inspect", engine)
    assert code == 0 and "blocked_matmul" in out


def test_q4_without_a_cxx_compiler_is_refused_with_the_fix(checkpoint, tmp_path, capsys, monkeypatch):
    import specc.compiler

    monkeypatch.setattr(specc.compiler, "compiler", lambda: None)
    code, _, err = run_cli(capsys, "compile", checkpoint, "--method", "none", "--dtype", "bfloat16",
                           "--quantize", "q4", "-o", tmp_path / "e")
    assert code != 0 and "needs a C++ compiler" in err and "install g++" in err
    assert not (tmp_path / "e").exists()


def test_a_q4_draft_engine_reports_its_draft_graphs_apart(checkpoint, tmp_path, capsys):
    engine = tmp_path / "e"
    code, out, _ = run_cli(capsys, "compile", checkpoint, "--method", "draft-model", "--set",
                           f"draft_model={checkpoint}", "--dtype", "bfloat16", "--quantize-draft", "q4",
                           "--max-seq-len", "64", "-o", engine)
    manifest = json.loads((engine / "manifest.json").read_text())
    assert code == 0 and "quantization" not in manifest and manifest["draft_quantization"]["scheme"] == "q4"
    assert out.count("quantized q4") == 1 and "draft graphs: quantized q4" in out
    code, out, _ = run_cli(capsys, "inspect", engine)
    assert code == 0 and "draft graphs: quantized q4" in out
