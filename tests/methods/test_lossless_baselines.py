"""`none` and `draft-model` engines reproduce Hugging Face greedy `generate`
token for token, for every supported family, in eager and Inductor."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from specc.testing import FAMILIES, varied_prompts
from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine

MAX_NEW_TOKENS = 24
NUM_PROMPTS = 20
METHODS = {
    "none": [],
    "draft-chain": ["num_draft_tokens=4"],
    "draft-tree": ["num_draft_tokens=3", "tree_width=3"],
}

_references: dict[str, list[list[int]]] = {}


def hf_greedy(checkpoint, prompts) -> list[list[int]]:
    key = str(checkpoint)
    if key not in _references:
        model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        outputs = []
        for ids in prompts:
            generated = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                                       attention_mask=torch.ones(1, len(ids), dtype=torch.long))
            outputs.append(generated[0, len(ids):].tolist())
        _references[key] = outputs
    return _references[key]


def compile_variant(checkpoints, tmp_path, family: str, variant: str, backend: str):
    target, draft = checkpoints(family)
    method = "none" if variant == "none" else "draft-model"
    request = CompileRequest(model=str(target), method=method, output=tmp_path / "engine", backend=backend,
                             max_seq_len=96, settings=METHODS[variant],
                             draft_model=str(draft) if method == "draft-model" else None)
    compile_engine(request)
    return load_engine(tmp_path / "engine"), target


def assert_identical(engine, target) -> list:
    prompts = varied_prompts(NUM_PROMPTS, 96, seed=11)
    expected = hf_greedy(target, prompts)
    results = [engine.generate_ids(ids, MAX_NEW_TOKENS) for ids in prompts]
    for ids, want, got in zip(prompts, expected, results):
        assert got.token_ids == want, f"prompt {ids}: engine {got.token_ids} != HF {want}"
    assert any(len(w) < MAX_NEW_TOKENS for w in expected), "no prompt hit EOS; the test lost coverage"
    assert any(len(w) == MAX_NEW_TOKENS for w in expected), "no prompt hit max length"
    return results


@pytest.mark.parametrize("variant", list(METHODS))
@pytest.mark.parametrize("family", FAMILIES)
def test_eager_matches_hf_greedy(checkpoints, tmp_path, family, variant):
    engine, target = compile_variant(checkpoints, tmp_path, family, variant, "eager")
    results = assert_identical(engine, target)
    if variant != "none":
        accepted = sum(r.stats.accepted_tokens for r in results)
        drafted = sum(r.stats.drafted_tokens for r in results)
        assert 0 < accepted < drafted, "the noisy draft should be accepted sometimes, rejected sometimes"
        assert sum(r.stats.target_forward_passes for r in results) < sum(r.stats.new_tokens for r in results)
    else:
        assert all(r.stats.mean_accepted_length == 1.0 for r in results)


@pytest.mark.parametrize("variant", ["none", "draft-tree"])
@pytest.mark.parametrize("family", FAMILIES)
def test_inductor_matches_hf_greedy(checkpoints, tmp_path, family, variant):
    engine, target = compile_variant(checkpoints, tmp_path, family, variant, "inductor")
    assert engine.compile_seconds > 0
    assert_identical(engine, target)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["none", "draft-tree"])
def test_aoti_matches_hf_greedy(checkpoints, tmp_path, variant):
    engine, target = compile_variant(checkpoints, tmp_path, "llama", variant, "aoti")
    assert (engine.path / "compiled" / "target.pt2").is_file()
    assert_identical(engine, target)
