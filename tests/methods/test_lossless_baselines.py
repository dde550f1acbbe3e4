"""`none` and `draft-model` AOTInductor engines package the target graph and reproduce Hugging
Face greedy `generate` token for token. Every family in eager and Inductor, chains and trees:
the exactness matrix (tests/matrix/test_exactness_matrix.py)."""

from __future__ import annotations

import pytest
from specc.testing.checkpoints import assert_matches_hf_greedy, varied_prompts
from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine

MAX_NEW_TOKENS = 24
NUM_PROMPTS = 20
METHODS = {
    "none": [],
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


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["none", "draft-tree"])
def test_aoti_matches_hf_greedy(checkpoints, tmp_path, variant):
    engine, target = compile_variant(checkpoints, tmp_path, "llama", variant, "aoti")
    assert (engine.path / "compiled" / "target.pt2").is_file()
    assert_identical(engine, target)
