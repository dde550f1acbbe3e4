"""The examples run: the Python API script, the graph-inspection script, and a
method defined outside specc that plugs in through the entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.errors import UsageError
from specc.testing.checkpoints import (assert_matches_hf_greedy, hf_greedy, sample_calibration_text,
                                         varied_prompts)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROMPT_LOOKUP = EXAMPLES / "prompt_lookup"
MAX_NEW_TOKENS = 24
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}




@pytest.mark.parametrize("settings", [["max_ngram=3"], ["max_ngram=2", "tree_width=3"]])
def test_prompt_lookup_matches_hf_greedy(checkpoints, tmp_path, prompt_lookup_method, settings):
    target, _ = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="prompt-lookup", output=tmp_path / "e",
                                  max_seq_len=96, settings=settings))
    engine = load_engine(tmp_path / "e")
    prompts = varied_prompts(12, 96, seed=11)
    results = assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target, prompts,
                                       MAX_NEW_TOKENS)
    assert sum(r.stats.accepted_tokens for r in results) > 0, "no n-gram draft was ever accepted"
    assert sum(r.stats.drafted_tokens for r in results) > sum(r.stats.accepted_tokens for r in results)



def test_prompt_lookup_with_a_corpus_keeps_it_and_drafts_from_it_exactly(checkpoints, tmp_path, prompt_lookup_method):
    target, _ = checkpoints("llama")
    corpus = sample_calibration_text(target, tmp_path / "written.txt", 16, temperature=0.01)
    compile_engine(CompileRequest(model=str(target), method="prompt-lookup", output=tmp_path / "e",
                                  max_seq_len=96, settings=[f"lookup_corpus={corpus}"]))
    engine = load_engine(tmp_path / "e")
    assert len(engine.method_state["lookup_corpus"]) == 16, "the corpus is tokenized into the engine"
    assert list(engine.drafter.branches) == ["lookup", "corpus"]
    prompts = varied_prompts(12, 96, seed=11)
    assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target, prompts, MAX_NEW_TOKENS)
    assert engine.drafter.method_report()["branches"]["corpus"]["accepted_tokens"] > 0


def test_prompt_lookup_refuses_a_missing_corpus_before_writing_anything(checkpoints, tmp_path, prompt_lookup_method):
    with pytest.raises(UsageError, match="lookup_corpus=.*no such file"):
        compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="prompt-lookup",
                                      output=tmp_path / "e", max_seq_len=96,
                                      settings=[f"lookup_corpus={tmp_path}/none.jsonl"]))
    assert not (tmp_path / "e").exists()

def _installed() -> bool:
    try:
        distribution("specc-prompt-lookup")
        return True
    except PackageNotFoundError:
        return False


def test_method_outside_specc_installs_and_runs_through_the_entry_point(checkpoints, tmp_path):
    if not _installed():
        install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                                  "-e", str(PROMPT_LOOKUP)], capture_output=True, text=True)
        assert install.returncode == 0, install.stderr
    specc = [sys.executable, "-m", "specc.cli.main"]
    listed = subprocess.run([*specc, "methods"], capture_output=True, text=True, env=ENV)
    assert listed.returncode == 0 and "prompt-lookup (lossless)" in listed.stdout, listed.stderr
    target, _ = checkpoints("llama")
    engine = tmp_path / "engine"
    compiled = subprocess.run([*specc, "compile", str(target), "--method", "prompt-lookup", "-o", str(engine),
                               "--max-seq-len", "96"], capture_output=True, text=True, env=ENV)
    assert compiled.returncode == 0, compiled.stderr
    prompt = varied_prompts(1, 96, seed=11)[0]
    check = (f"import json, specc; e = specc.load({str(engine)!r}); "
             f"print(json.dumps(e.generate({prompt!r}, max_new_tokens={MAX_NEW_TOKENS}).token_ids))")
    ran = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=ENV)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == hf_greedy(target, [prompt], MAX_NEW_TOKENS)[0]


def test_compile_and_generate_script(checkpoints):
    target, _ = checkpoints("llama")
    ran = subprocess.run([sys.executable, str(EXAMPLES / "compile_and_generate.py"), str(target),
                          "--method", "draft-model", "--set", f"draft_model={checkpoints('llama')[1]}",
                          "--max-new-tokens", "8"], capture_output=True, text=True, env=ENV)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("def quicksort(xs):") and "mean accepted length" in ran.stderr


def test_inspect_graph_script(checkpoints):
    target, _ = checkpoints("llama")
    ran = subprocess.run([sys.executable, str(EXAMPLES / "inspect_graph.py"), str(target), "--method", "kangaroo",
                          "--graph", "deep"], capture_output=True, text=True, env=ENV)
    assert ran.returncode == 0, ran.stderr
    assert "expose_layer_exit" in ran.stdout and "exit_hidden: layer_exit float[1, 'q', 'hidden']" in ran.stdout
