"""`specc bench` end to end on a tiny engine: a smoke run, not a measurement."""

from __future__ import annotations

import json
import shutil

import pytest

from specc.cli.main import main
from specc.compiler import CompileRequest, compile_engine


@pytest.fixture(scope="module")
def draft_engine(checkpoints, tmp_path_factory):
    target, draft = checkpoints("llama")
    output = tmp_path_factory.mktemp("bench") / "engine"
    compile_engine(CompileRequest(model=str(target), method="draft-model", output=output, max_seq_len=64,
                                  settings=[f"draft_model={draft}"]))
    return output


def test_bench_smoke_writes_json_and_png(draft_engine, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w12 w40 w41", "category": "a"}\n'
                       '{"prompt": "w7 w7 w8", "category": "b"}\n'
                       '{"prompt": "w9", "category": "a"}\n')
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main(["bench", str(draft_engine), "--prompts", str(prompts), "--num-prompts", "2",
                 "--max-new-tokens", "6", "--repeats", "1", "--json", str(out_json), "--plot", str(out_png)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "== overall (2 prompts) ==" in captured.out and "specc draft-model" in captured.out
    doc = json.loads(out_json.read_text())
    assert doc["engine"]["method"] == "draft-model" and doc["settings"]["num_prompts"] == 2
    assert {s["name"] for s in doc["systems"]} == {"hf-greedy", "hf-prompt-lookup", "hf-assisted", "specc-none",
                                                   "engine"}
    assert set(doc["categories"]) == {"a", "b"}
    assert doc["identity"]["total"] == 2 and doc["identity_flag"] is False   # draft-model is lossless
    assert doc["overall"]["systems"]["specc-none"]["identity_vs_hf_greedy"]["share"] == 1.0
    assert len(doc["runs"]) == 2 * 5
    assert any("repeat" in note for note in doc["notes"])    # one repeat gives no spread: said so
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_bench_says_when_the_source_checkpoint_is_gone(checkpoints, tmp_path, capsys):
    target, _ = checkpoints("llama")
    copy = shutil.copytree(target, tmp_path / "checkpoint")
    engine = tmp_path / "engine"
    compile_engine(CompileRequest(model=str(copy), method="none", output=engine, max_seq_len=32))
    shutil.rmtree(copy)
    code = main(["bench", str(engine), "--prompts", "code", "--num-prompts", "1", "--repeats", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert "source checkpoint" in err and str(copy) in err


def test_bench_says_when_drafts_are_capped_for_exactness(draft_engine, tmp_path, capsys, monkeypatch):
    from specc.lower.eager import EagerBackend

    monkeypatch.setattr(EagerBackend, "exact_rows", lambda self, dtype: 2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w12 w40 w41"}\n')
    out_json = tmp_path / "bench.json"
    code = main(["bench", str(draft_engine), "--prompts", str(prompts), "--max-new-tokens", "6", "--repeats", "1",
                 "--json", str(out_json)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(out_json.read_text())
    assert any(note.startswith("drafts capped at 2 nodes") for note in doc["notes"])
    engine_runs = [r["stats"] for r in doc["runs"] if r["system"] == "engine"]
    assert engine_runs and all(r["drafted_tokens"] <= r["draft_rounds"] for r in engine_runs)


def test_bench_reports_alpha_by_depth_and_a_composed_drafters_branch_shares(draft_engine, tmp_path, capsys,
                                                                             monkeypatch):
    """The engine's drafter swapped for two composed lookup drafters: the branch counts of the
    timed runs (not the warm-up's) add up to the accepted tokens the statistics count."""
    import specc.engine.loaded as loaded
    from specc.runtime.compose import ComposedDrafter
    from specc.runtime.ngram import NgramDrafter

    load = loaded.load_engine

    def load_composed(path, *args, **kwargs):
        engine = load(path, *args, **kwargs)
        if path == draft_engine:
            engine.runtime.drafter = ComposedDrafter({"long": NgramDrafter(3, 2, 4),
                                                      "short": NgramDrafter(1, 1, 2)})
        return engine

    monkeypatch.setattr(loaded, "load_engine", load_composed)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w12 w5 w9 w12 w5 w9"}\n{"prompt": "w7 w8 w7 w8 w7"}\n')
    out_json = tmp_path / "bench.json"
    code = main(["bench", str(draft_engine), "--prompts", str(prompts), "--max-new-tokens", "12",
                 "--repeats", "1", "--json", str(out_json)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(out_json.read_text())
    engine = doc["overall"]["systems"]["engine"]
    acceptance, branches = engine["acceptance"], engine["branches"]
    assert len(acceptance["alpha_per_depth"]) >= 1 and "α by depth" in captured.out
    assert branches["runs"] == 2 and set(branches["branches"]) == {"long", "short"}
    assert branches["accepted_tokens"] == acceptance["accepted_tokens"]
    assert sum(b["proposed_tokens"] for b in branches["branches"].values()) >= acceptance["drafted_tokens"] > 0
    assert f"branches, share of the {branches['accepted_tokens']} accepted tokens: long " in captured.out
    assert all(run["method_report"] is None for run in doc["runs"] if run["system"] != "engine")
