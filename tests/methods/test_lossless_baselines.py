"""`none` and `draft-model` engines reproduce Hugging Face greedy `generate`
token for token, for every supported family, in eager and Inductor."""

from __future__ import annotations

import pytest
from specc.testing.checkpoints import FAMILIES, assert_matches_hf_greedy, varied_prompts
from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine

MAX_NEW_TOKENS = 24
NUM_PROMPTS = 20
METHODS = {
    "none": [],
    "draft-chain": ["num_draft_tokens=4"],
    "draft-tree": ["num_draft_tokens=3", "tree_width=3"],
}

def compile_variant(checkpoints, tmp_path, family: str, variant: str, backend: str):
    target, draft = checkpoints(family)
    method = "none" if variant == "none" else "draft-model"
    request = CompileRequest(model=str(target), method=method, output=tmp_path / "engine", backend=backend,
                             max_seq_len=96,
                             settings=METHODS[variant] + ([f"draft_model={draft}"] if method == "draft-model" else []))
    compile_engine(request)
    return load_engine(tmp_path / "engine"), target


def assert_identical(engine, target) -> list:
    return assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target,
                                    varied_prompts(NUM_PROMPTS, 96, seed=11), MAX_NEW_TOKENS)


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


# `none` under Inductor on every family: the exactness matrix (tests/matrix), on quirkier checkpoints.
@pytest.mark.parametrize("variant", ["draft-tree"])
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
