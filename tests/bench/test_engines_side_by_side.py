"""benchmarks/engines_side_by_side.py: engines of one model against the first, interleaved, on tiny engines."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoModelForCausalLM

from specc.compiler import CompileRequest, compile_engine
from tests.bench.scripts import load_benchmark


def test_engines_run_side_by_side_against_the_first(checkpoints, tmp_path, one_thread, prompt_lookup_method):
    target, draft = checkpoints("llama")
    engines = []
    for method, settings in (("none", []), ("prompt-lookup", ["max_ngram=2"]), ("draft-model", [f"draft_model={draft}"])):
        engines.append(tmp_path / method)
        compile_engine(CompileRequest(model=str(target), method=method, output=engines[-1], max_seq_len=128,
                                      settings=settings))
    script = load_benchmark("engines_side_by_side")
    results = tmp_path / "results"
    assert script.main([*map(str, engines), "--prompts", "code", "--num-prompts", "2", "--max-new-tokens", "8",
                        "--repeats", "2", "--name", "tiny", "--results-dir", str(results)]) == 0
    (written,) = results.glob("*-tiny-code-8tok.json")
    doc = json.loads(written.read_text())
    summary = doc["summary"]
    assert list(summary) == ["0-none", "1-prompt-lookup", "2-draft-model"]
    assert summary["0-none"]["speedup"]["median"] == 1.0 and summary["0-none"]["acceptance_rate"] is None
    assert all(row["identical_to_reference"] == "2/2" for row in summary.values()), "float32 lossless engines"
    assert summary["2-draft-model"]["acceptance_rate"] is not None
    assert len(doc["runs"]) == 3 * 2 * 2
    table = written.with_suffix(".md").read_text()
    assert "| draft-model (" in table and "2/2 |" in table
    account = doc["eq6"]["2-draft-model"]   # every drafting engine's eq. 6 inputs, and its prediction
    assert account["M"] == summary["2-draft-model"]["mean_accepted_length"] and account["c"] > 0
    assert (account["expected_speedup"] > 0) if account["alpha"] > 0 else "α = 0" in account["reason"]
    assert "| 2-draft-model | " in table and "SWIFT eq. 6" in table
    bound = doc["bandwidth_bound"]
    model = AutoModelForCausalLM.from_pretrained(target)
    parameters = sum(p.numel() for p in model.parameters())
    assert not model.config.tie_word_embeddings
    weights = 4 * (parameters - model.get_input_embeddings().weight.numel())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())   # the rotary frequencies
    assert weights <= bound["weight_bytes_per_token"] <= weights + buffers, \
        "float32: 4 bytes a parameter, none for the embedding a step reads one row of"
    assert bound["reference_share_of_bound"] > 0 and "bandwidth bound:" in table
    per_position = 2 * model.config.num_hidden_layers * model.config.num_key_value_heads * \
        (model.config.hidden_size // model.config.num_attention_heads) * 4
    assert per_position < bound["kv_cache_bytes_per_token"] <= 128 * per_position, "max_seq_len 128"
    assert bound["bound_tokens_per_second"] < bound["weights_only_bound_tokens_per_second"]
    assert "MB of cached keys and values (mean)" in table


def test_llama_cpp_runs_beside_them_on_the_first_engines_gguf(checkpoints, tmp_path, one_thread, monkeypatch):
    from tests.bench.test_llama_cpp_baseline import FakeLlama, install_fake_llama_cpp

    install_fake_llama_cpp(monkeypatch)
    target, _ = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "none", max_seq_len=128))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    script = load_benchmark("engines_side_by_side")
    results = tmp_path / "results"
    assert script.main([str(tmp_path / "none"), "--baseline", "llama.cpp", "--gguf", str(gguf), "--prompts", "code",
                        "--num-prompts", "2", "--max-new-tokens", "8", "--repeats", "1", "--name", "tiny",
                        "--results-dir", str(results)]) == 0
    doc = json.loads(next(results.glob("*.json")).read_text())
    assert list(doc["summary"]) == ["0-none", "llama.cpp", "llama.cpp-prompt-lookup"]
    assert doc["summary"]["llama.cpp"]["mean_accepted_length"] is None
    assert doc["summary"]["llama.cpp"]["identical_to_reference"] == "0/2"
    assert len(FakeLlama.made) == 2
    assert "| llama.cpp (llama-cpp-python), greedy | model.gguf |" in next(results.glob("*.md")).read_text()


def test_settings_of_one_directory_are_variants_of_one_load():
    """A sweep over load-time settings loads each directory once (a 1.5B engine is several GB)."""
    script = load_benchmark("engines_side_by_side")
    loads = []

    class Loaded:
        def with_settings(self, settings):
            return ("variant", tuple(settings))

    def load(path):
        loads.append(path)
        return Loaded()

    engines = script.load_engines([(Path("a"), []), (Path("a"), ["x=1"]), (Path("b"), ["y=2"])], load)
    assert loads == [Path("a"), Path("b")]
    assert isinstance(engines[0], Loaded) and engines[1:] == [("variant", ("x=1",)), ("variant", ("y=2",))]
