"""Reusing the KV cache a previous generation left (`specc.runtime.prefix_reuse`): only the
new part of a prompt is prefilled, and what is generated stays exact."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specc.compiler import CompileRequest, compile_engine
from specc.contract.drafter import Capabilities
from specc.engine.loaded import load_engine
from specc.runtime.compose import ComposedDrafter
from specc.runtime.ngram import NgramDrafter
from specc.runtime.prefix_reuse import PrefixReuse, resumable
from specc.testing.checkpoints import assert_turns_reusing_match_hf_greedy, reusing_turns

NEW = 12


def test_the_usable_prefix_is_the_common_one_and_leaves_the_last_prompt_token():
    target = SimpleNamespace(forward_passes=7)
    kept = PrefixReuse()
    kept.keep([1, 2, 3], [4, 5], target)
    assert kept.tokens == [1, 2, 3, 4], "the last generated token was never fed"
    assert kept.usable([1, 2, 3, 4, 9, 9], target) == 4
    assert kept.usable([1, 2, 8, 4], target) == 2
    assert kept.usable([1, 2, 3, 4], target) == 3, "the last prompt token is prefilled for its logits"
    assert kept.usable([5], target) == 0
    target.forward_passes += 1
    assert kept.usable([1, 2, 3, 4, 9], target) == 0, "a target call since then may have overwritten slots"
    kept.forget()
    assert kept.usable([1, 2, 3, 4, 9], SimpleNamespace(forward_passes=-1)) == 0


def test_resumable_needs_both_the_target_and_every_drafter_branch():
    target = SimpleNamespace(capabilities=Capabilities(resumable=True))
    lookup = NgramDrafter(3, 1, 4, 1)
    stateful = SimpleNamespace(capabilities=Capabilities(composable=True))   # does not say it can resume
    assert resumable(target, None) and resumable(target, lookup)
    assert not resumable(SimpleNamespace(capabilities=Capabilities()), None), "a method's own target must say so"
    assert resumable(target, ComposedDrafter({"a": lookup, "b": NgramDrafter(2, 1, 4, 1)}))
    assert not resumable(target, ComposedDrafter({"a": lookup, "b": stateful}))


@pytest.fixture(scope="module")
def compiled(checkpoints, wide_checkpoint, prompt_lookup_method, tmp_path_factory):
    """(method, dtype, model) -> (checkpoint, engine); model "tiny" (a small vocabulary: its
    replies repeat, so prompt lookup drafts) or "wide" (SmolLM2's widths: bfloat16 rounds a
    row differently in calls of other row counts)."""
    built = {}

    def get(method: str, dtype: str, model: str = "tiny"):
        if (method, dtype, model) not in built:
            checkpoint = checkpoints("llama")[0] if model == "tiny" else wide_checkpoint
            out = tmp_path_factory.mktemp(f"reuse-{method}-{dtype}-{model}") / "engine"
            compile_engine(CompileRequest(model=str(checkpoint), method=method, output=out, dtype=dtype,
                                          max_seq_len=160))
            built[method, dtype, model] = (checkpoint, load_engine(out))
        return built[method, dtype, model]

    return get


@pytest.mark.parametrize("method", ["none", "prompt-lookup"])
def test_a_float32_turn_prefills_only_its_new_tokens_and_matches_hf_greedy(compiled, method):
    checkpoint, engine = compiled(method, "float32")
    reused = assert_turns_reusing_match_hf_greedy(engine, checkpoint, [5, 9, 14, 3, 22], NEW)
    assert reused[0] == 0


def test_a_diverging_prompt_reuses_only_the_shared_part_and_other_calls_end_reuse(compiled):
    _, engine = compiled("none", "float32")
    engine.generate_ids([5, 9, 14, 3, 22], NEW, reuse_prefix=True)
    assert engine.generate_ids([5, 9, 40, 41], NEW, reuse_prefix=True).stats.reused_prompt_tokens == 2
    assert engine.generate_ids([5, 9, 40, 41], NEW).stats.reused_prompt_tokens == 0, "off unless asked"
    engine.target.prefill(torch.tensor([6, 7]), 0)
    assert engine.generate_ids([5, 9, 40, 41], NEW, reuse_prefix=True).stats.reused_prompt_tokens == 0


@pytest.mark.parametrize("model", ["tiny", "wide"])
def test_in_bfloat16_prompt_lookup_reusing_matches_its_none_engine_reusing(compiled, model):
    _, none = compiled("none", "bfloat16", model)
    _, lookup = compiled("prompt-lookup", "bfloat16", model)
    first = [5, 9, 14, 3, 22, 5, 9, 14]
    plain = [result for _, result in reusing_turns(none, first, NEW)]
    drafted = [result for _, result in reusing_turns(lookup, first, NEW)]
    assert [t.token_ids for t in drafted] == [t.token_ids for t in plain]
    assert [t.stats.reused_prompt_tokens for t in drafted] == [t.stats.reused_prompt_tokens for t in plain]
    assert all(t.stats.reused_prompt_tokens > 0 for t in drafted[1:])
    if model == "tiny":   # the wide random model's replies rarely repeat a token: nothing to look up
        assert sum(t.stats.drafted_tokens for t in drafted) > 0, "verifications ran, not only decode steps"


def test_the_python_api_reuses_when_asked(compiled):
    from specc.api import Engine

    _, loaded = compiled("none", "float32")
    engine = Engine(loaded)
    first = engine.generate([5, 9, 14, 3], NEW, reuse_prefix=True)
    again = engine.generate([5, 9, 14, 3, *first.token_ids, 7], NEW, reuse_prefix=True)
    assert again.stats.reused_prompt_tokens == 3 + len(first.token_ids)
    assert engine.generate([5, 9, 14, 3], NEW).stats.reused_prompt_tokens == 0
    streamed = "".join(engine.stream([5, 9, 14, 3, 8], NEW, reuse_prefix=True))
    assert streamed and loaded._prefix.tokens[:5] == [5, 9, 14, 3, 8]
