"""Composition as an engine option (`specc.engine.composition`): every method whose config
inherits `CompositionOptions` compiles with the n-gram branch in its tree, and the engine stays
token-identical to Hugging Face greedy while both branches draft accepted tokens."""

from __future__ import annotations

import pytest

from specc.compiler import CompileRequest, compile_engine
from specc.contract.descriptor import get_method
from specc.contract.sampling import SamplingConfig
from specc.engine.composition import engine_runtime
from specc.engine.loaded import load_engine
from specc.errors import UsageError
from specc.runtime.generate import generate
from specc.testing.checkpoints import assert_matches_hf_greedy, build_tiny_checkpoint, hf_greedy, varied_prompts

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
TRAIN = ["train_steps=20", "train_seq_len=32", "eval_sequences=2", "eval_every=20", "learning_rate=1e-2"]
# SpecEE's lossless drafter must exit for its chain to be a draft: a low threshold, every layer scheduled.
SPECEE = ["train_steps=20", "train_windows=8", "predictor_windows=4", "eval_sequences=2", "predictor_epochs=3",
          "train_seq_len=32", "eval_every=10", "exit_threshold=0.001", "offline_layers=64"]


def repeating_prompts() -> list[list[int]]:
    """Prompts that hold a span twice, so the n-gram branch finds something to copy."""
    return [ids + ids[:6] + ids for ids in varied_prompts(6, 96, seed=3)[2:]] + varied_prompts(4, 96, seed=9)


@pytest.fixture(scope="module")
def composed_engine(checkpoints, tmp_path_factory):
    """method -> an engine of it compiled with `lookup=true` on the tiny llama checkpoint."""
    built = {}

    def get(method: str):
        if method not in built:
            target, draft = checkpoints("llama")[:2]
            root = tmp_path_factory.mktemp(method)
            settings = {"draft-model": [f"draft_model={draft}"], "kangaroo": [*TRAIN, "exit_layer=1"],
                        "specee": SPECEE}[method]
            compile_engine(CompileRequest(model=str(target), method=method, output=root / "engine",
                                          max_seq_len=MAX_SEQ_LEN, settings=[*settings, "lookup=true"]))
            built[method] = load_engine(root / "engine"), target
        return built[method]

    return get


@pytest.mark.parametrize("max_rows", [None, 4])
@pytest.mark.parametrize("method", ["kangaroo", "draft-model", "specee"])
def test_a_model_drafter_and_the_ngram_branch_share_the_tree_losslessly(composed_engine, one_thread, method,
                                                                        max_rows):
    """Both branches get accepted tokens in, with trees and under the chain-only budget of
    bfloat16 engines (`max_rows=4`), and every token is HF greedy's. (SpecEE's drafter writes
    the target's cache as it drafts, and its exact leading rows ride in the merged draft.)"""
    engine, target = composed_engine(method)
    runtime = engine_runtime(engine.method, engine.context, engine.config)
    assert type(runtime.drafter).__name__ == "ComposedDrafter"
    assert_matches_hf_greedy(
        lambda ids: generate(runtime.target, runtime.drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN,
                             max_rows=max_rows), target, repeating_prompts(), MAX_NEW_TOKENS)
    branches = runtime.drafter.method_report()["branches"]
    assert set(branches) == {method, "lookup"}
    assert branches[method]["accepted_tokens"] > 0 and branches["lookup"]["accepted_tokens"] > 0


def test_specee_lookup_needs_its_lossless_chain():
    with pytest.raises(UsageError, match="mode='tree' drafts no chain"):
        get_method("specee").config_class.from_assignments(["mode=tree", "lookup=true"])


def test_without_lookup_settings_the_methods_drafter_runs_alone(composed_engine):
    engine, _ = composed_engine("draft-model")
    import dataclasses

    plain = engine_runtime(engine.method, engine.context, dataclasses.replace(engine.config, lookup=False))
    assert type(plain.drafter).__name__ == "DraftModelDrafter"


def test_the_lookup_branch_is_switched_as_an_engine_loads_without_recompiling(composed_engine, one_thread):
    engine, target = composed_engine("draft-model")
    off = load_engine(engine.path, settings=["lookup=false"])
    assert type(off.drafter).__name__ == "DraftModelDrafter" and off.config.lookup is False
    tuned = load_engine(engine.path, settings=["lookup=true", "lookup_tokens=4"])
    assert type(tuned.drafter).__name__ == "ComposedDrafter" and tuned.config.lookup_tokens == 4
    assert_matches_hf_greedy(lambda ids: tuned.generate_ids(ids, MAX_NEW_TOKENS), target,
                             repeating_prompts()[:3], MAX_NEW_TOKENS)


def test_a_drafters_depth_and_stopping_rule_change_as_an_engine_loads(composed_engine, one_thread):
    """draft-model's `num_draft_tokens` and `stop_threshold` change no graph: an engine takes them
    at load, drafts at most the new depth a round, and stays HF greedy's."""
    engine, target = composed_engine("draft-model")
    tuned = load_engine(engine.path, settings=["lookup=false", "num_draft_tokens=2", "stop_threshold=0.4"])
    assert (tuned.config.num_draft_tokens, tuned.config.stop_threshold) == (2, 0.4)
    outputs = assert_matches_hf_greedy(lambda ids: tuned.generate_ids(ids, MAX_NEW_TOKENS), target,
                                       repeating_prompts()[:3], MAX_NEW_TOKENS)
    rounds = [n for output in outputs for n in output.stats.drafted_per_round]
    assert rounds and max(rounds) <= 2


def test_a_variant_with_other_settings_shares_the_graphs_and_takes_turns(composed_engine, one_thread):
    """`with_settings`: no second load, its own runtime and caches; the engine and its variant
    generate in turn, each HF greedy's, each drafting as its own settings say."""
    engine, target = composed_engine("draft-model")
    variant = engine.with_settings(["lookup=false", "num_draft_tokens=1"])
    assert variant.context is engine.context and variant.runtime is not engine.runtime
    assert engine.config.lookup and not variant.config.lookup and engine.config.num_draft_tokens > 1
    prompts = repeating_prompts()[:3]
    for ids, want in zip(prompts, hf_greedy(target, prompts, MAX_NEW_TOKENS)):
        assert engine.generate_ids(ids, MAX_NEW_TOKENS).token_ids == want
        got = variant.generate_ids(ids, MAX_NEW_TOKENS)
        assert got.token_ids == want and max(got.stats.drafted_per_round) <= 1


def test_the_fields_an_engine_may_change_at_load_are_marked_and_listed(capsys):
    from specc.cli.main import main

    draft_model = get_method("draft-model").config_class
    assert draft_model.load_time_fields() == ("num_draft_tokens", "stop_threshold", "lookup", "lookup_max_ngram",
                                              "lookup_tokens")
    assert "stop_probability" in get_method("eagle").config_class.load_time_fields()
    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    assert "[set at load]" in next(line for line in listing.splitlines() if "stop_threshold: float" in line)
    assert "[set at load]" not in next(line for line in listing.splitlines() if "draft_vocab_size: int" in line)


@pytest.mark.parametrize("settings, message", [
    (["draft_vocab_size=4"], "draft_vocab_size cannot change when an engine loads"),
    (["lookup_tokens=0"], "lookup_tokens"),
    (["lookup_corpus=x.jsonl"], "lookup_corpus cannot change"),
    (["lookup"], "malformed config setting"),
])
def test_load_time_settings_other_than_the_lookup_branch_s_are_refused(composed_engine, settings, message):
    engine, _ = composed_engine("draft-model")
    with pytest.raises(UsageError, match=message):
        load_engine(engine.path, settings=settings)


def test_a_method_that_does_not_compose_takes_no_load_time_settings(tmp_path):
    target = build_tiny_checkpoint("llama", tmp_path / "target")
    compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "engine", max_seq_len=32))
    with pytest.raises(UsageError, match="'none' has no settings that can change when the engine loads"):
        load_engine(tmp_path / "engine", settings=["lookup=true"])


@pytest.mark.parametrize("method", ["kangaroo", "draft-model", "eagle", "specee"])
def test_every_composable_method_lists_the_shared_lookup_settings(method):
    fields = {field["name"] for field in get_method(method).config_class.describe_fields()}
    assert {"lookup", "lookup_max_ngram", "lookup_tokens", "lookup_corpus"} <= fields


def test_a_missing_lookup_corpus_is_refused_before_any_weights_load(tmp_path):
    target = build_tiny_checkpoint("llama", tmp_path / "target")
    with pytest.raises(UsageError, match="lookup_corpus"):
        compile_engine(CompileRequest(model=str(target), method="kangaroo", output=tmp_path / "engine",
                                      settings=["lookup_corpus=" + str(tmp_path / "missing.jsonl")]))
    assert not (tmp_path / "engine").exists()
