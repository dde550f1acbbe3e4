"""SpecEE: lossless mode token-identical to HF greedy on every family (both KV policies),
the target's distribution when sampling, the lossy `ar` mode's exits and its
exactness when nothing exits, the engine round trip and the compile-time report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from specc.capture.load import load_model, load_tokenizer
from specc.compiler import CompileRequest, build_program, compile_engine, install_weights, training_context
from specc.contract.descriptor import TrainResult, get_method
from specc.contract.drafter import Capabilities, Draft
from specc.contract.sampling import SamplingConfig
from specc.contract.tree import TreeSpec, tree_tensors
from specc.engine.loaded import load_engine
from specc.errors import UsageError
from specc.methods.specee import SpecEEConfig
from specc.methods.specee.config import SCHEDULE_KEY
from specc.methods.specee.runtime import build_runtime
from specc.methods.specee.train import train_specee
from specc.runtime.context import MethodContext
from specc.runtime.generate import generate
from specc.testing.checkpoints import (FAMILIES, assert_distribution, assert_matches_hf_greedy,
                                       assert_turns_reusing_match_hf_greedy, build_tiny_checkpoint, exact_marginals,
                                       sample_calibration_text, varied_prompts)
from specc.host.threads import torch_threads

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
TRAIN = dict(train_steps=20, train_windows=8, predictor_windows=4, eval_sequences=2, predictor_epochs=3,
             train_seq_len=32, eval_every=10)
# Exits must happen for the tests to mean anything: a low threshold and every layer scheduled.
EXITING = dict(exit_threshold=0.001, offline_layers=64)


@pytest.fixture(scope="module")
def programs(checkpoints):
    """family -> (checkpoint, trained program, manifest state), trained once with tiny settings."""
    built = {}

    def get(family: str):
        if family not in built:
            target = checkpoints(family)[0]
            config = SpecEEConfig(**TRAIN)
            models, captures, method = {"target": load_model(target)}, {}, get_method("specee")
            # The tiny qwen2 tokenizer encodes the built-in corpus to nothing: its heads stay untrained.
            trained = (TrainResult() if family == "qwen2" else
                       train_specee(training_context(models, method, config, MAX_SEQ_LEN, captures=captures),
                                    config, load_tokenizer(target)))
            program = build_program(models, method, config, MAX_SEQ_LEN, captures=captures, state=trained.state)
            install_weights(program, trained.weights)
            built[family] = (target, program, trained.state)
        return built[family]

    return get


def runtime(program, state, **settings):
    config = SpecEEConfig(**{**TRAIN, **EXITING, **settings})
    built = build_runtime(MethodContext.eager(program, MAX_SEQ_LEN, state=state), config)
    return built.target, built.drafter, config


def early_exit_of(target, drafter):
    return (drafter or target).early


def assert_identical(target, drafter, checkpoint: Path):
    return assert_matches_hf_greedy(
        lambda ids: generate(target, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN),
        checkpoint, varied_prompts(16, 96, seed=11), MAX_NEW_TOKENS)


# --- lossless mode ---------------------------------------------------------------


@pytest.mark.shared_data
@pytest.mark.parametrize("family", FAMILIES)
def test_lossless_matches_hf_greedy(programs, one_thread, family):
    checkpoint, program, state = programs(family)
    target, drafter, _ = runtime(program, state)
    results = assert_identical(target, drafter, checkpoint)
    exits = early_exit_of(target, drafter).exit_layers
    layers = early_exit_of(target, drafter).layerwise.num_layers
    assert any(e < layers - 1 for e in exits), "no token exited early: the test lost its meaning"
    accepted = sum(r.stats.accepted_tokens for r in results)
    assert 0 < accepted < sum(r.stats.drafted_tokens for r in results)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_lossless_with_the_mask_policy_matches_hf_greedy(programs, one_thread, family):
    checkpoint, program, state = programs(family)
    target, drafter, _ = runtime(program, state, kv_policy="mask")
    assert_identical(target, drafter, checkpoint)
    assert bool(drafter.early.missing.any()) or any(
        e < drafter.early.layerwise.num_layers - 1 for e in drafter.early.exit_layers)


def test_lossless_sampling_matches_the_target_distribution(tmp_path, one_thread):
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "model", seed=3, vocab_size=16, eos_token_id=None,
                                       num_hidden_layers=4)
    model = load_model(checkpoint)
    program = build_program({"target": model}, get_method("specee"), SpecEEConfig(candidates=2), MAX_SEQ_LEN)
    target, drafter, _ = runtime(program, {}, candidates=2, max_draft_steps=2)
    sampling = SamplingConfig(temperature=1.0)
    prompt, counts = [5, 9, 7], torch.zeros(2, 16)
    for seed in range(1000):
        tokens = generate(target, drafter, prompt, 3, dataclasses.replace(sampling, seed=seed), MAX_SEQ_LEN).token_ids
        counts[0, tokens[1]] += 1
        counts[1, tokens[2]] += 1
    second, third = exact_marginals(model, prompt, sampling)
    assert_distribution(counts[0], second, "second token")
    assert_distribution(counts[1], third, "third token")
    assert any(e < 3 for e in drafter.early.exit_layers)


class TakesTurns:
    """Every other round another branch's chain (the context's last tokens, reversed) is
    verified and the lossless drafter is not asked; it is shown every round, as a composed
    drafter shows its branches (`specc.runtime.compose`)."""

    capabilities = Capabilities(resumable=True, composable=True)

    def __init__(self, drafter):
        self.drafter, self.rounds = drafter, 0

    def begin(self, prompt, prefill):
        self.drafter.begin(prompt, prefill)

    def propose(self, tokens, budget, sampling, generator):
        self.rounds += 1
        if self.rounds % 2:
            return self.drafter.propose(tokens, budget, sampling, generator)
        chain = [tokens[-1], *tokens[-3:-1][::-1]][:budget.max_depth + 1]
        return Draft(tree_tensors(TreeSpec.chain(len(chain) - 1)), torch.tensor(chain))

    def observe(self, draft, acceptance, verification):
        self.drafter.observe(draft, acceptance, verification)


def test_a_lossless_drafter_shown_another_branchs_chain_keeps_its_head_in_step(programs, one_thread):
    """The head's KV over the committed tokens, the unasked rounds' roots included, is what
    drafting every round leaves, and the tokens stay HF greedy's."""
    checkpoint, program, state = programs("llama")
    prompts = varied_prompts(16, 96, seed=11)
    heads = []
    for wrap in (lambda drafter: drafter, TakesTurns):
        target, drafter, _ = runtime(program, state)
        results = assert_matches_hf_greedy(
            lambda ids: generate(target, wrap(drafter), ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN),
            checkpoint, prompts, MAX_NEW_TOKENS)
        # the head's KV after the last prompt; its last token never ran through the head
        committed = len(prompts[-1]) + len(results[-1].token_ids) - 1
        heads.append([t[..., :committed, :] for t in drafter.early.head.model.cache.tensors])
    for every_round, taking_turns in zip(*heads):
        torch.testing.assert_close(taking_turns, every_round, rtol=1e-4, atol=1e-5)


# --- ar mode (lossy) --------------------------------------------------------------


def test_ar_mode_without_exits_is_the_target(programs, one_thread):
    checkpoint, program, state = programs("llama")
    target, drafter, _ = runtime(program, state, mode="ar", exit_threshold=0.999999, offline_layers=1,
                                 online_tokens=0)
    assert drafter is None
    # Scores never pass 0.999999 for these predictors, so every token runs every layer.
    assert_identical(target, None, checkpoint)
    assert set(target.early.exit_layers) == {target.early.layerwise.num_layers - 1}


@pytest.mark.parametrize("kv_policy", ["propagate", "mask", "finish"])
def test_ar_mode_exits_early_and_emits_the_exit_layers_token(programs, one_thread, kv_policy):
    checkpoint, program, state = programs("llama")
    target, _, _ = runtime(program, state, mode="ar", kv_policy=kv_policy)
    result = generate(target, None, [5, 9, 7, 11], MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN)
    exits = target.early.exit_layers
    assert len(result.token_ids) >= 1 and len(exits) == result.stats.target_forward_passes - 1
    assert any(e < target.early.layerwise.num_layers - 1 for e in exits)


def test_the_online_schedule_adds_a_window_around_recent_exits():
    from specc.methods.specee.early_exit import ExitSchedule

    schedule = ExitSchedule(offline=(5,), scored=tuple(range(1, 11)), online_tokens=2)
    assert schedule.layers() == {5}
    schedule.record(3)
    assert schedule.layers() == {1, 3, 5}
    schedule.record(9)
    schedule.record(8)          # only the last two tokens count
    assert schedule.layers() == {5, 6, 7, 8, 9, 10}
    schedule.record(11)         # no exit (the last layer) is not a scored layer: ignored
    assert schedule.layers() == {5, 6, 7, 8, 9, 10}


# --- the engine and compile-time report -------------------------------------------------


@pytest.fixture(scope="module")
def engine(checkpoints, tmp_path_factory):
    target = checkpoints("llama")[0]
    root = tmp_path_factory.mktemp("specee-engine")
    out = root / "engine"
    # Text the target samples, not the built-in corpus: its size (and so the window count the
    # schedule assertion counts on) must not depend on whether ../shared/data is beside the clone.
    calib = sample_calibration_text(target, root / "calib.txt", sequences=32)
    settings = [f"{k}={v}" for k, v in TRAIN.items()] + [f"calib_data={calib}"]
    compile_engine(CompileRequest(model=str(target), method="specee", output=out, max_seq_len=MAX_SEQ_LEN,
                                  settings=settings))
    return load_engine(out), target


def test_engine_round_trip_is_lossless_and_records_the_schedule(engine, one_thread):
    loaded, target = engine
    assert set(loaded.manifest["graphs"]) == {"verify", "layerwise", "draft_head"}
    assert loaded.manifest["lossless"] is True
    schedule = loaded.manifest["method_state"][SCHEDULE_KEY]
    assert schedule["offline"] and set(schedule["histogram"]) and 0.0 <= schedule["heldout"]["agreement"] <= 1.0
    # The threshold came from the windows after the predictors' (TRAIN: 4 for predictors, 4 left).
    assert schedule["threshold_positions"] == 4 * TRAIN["train_seq_len"]
    assert_matches_hf_greedy(lambda ids: loaded.generate_ids(ids, MAX_NEW_TOKENS), target,
                             varied_prompts(8, 96, seed=11), MAX_NEW_TOKENS)


def test_a_lossless_turn_after_a_reused_prefix_matches_hf_greedy(checkpoints, tmp_path, one_thread):
    """Only each turn's new tokens are prefilled; the head resumes from its KV and the kept feature."""
    target = checkpoints("llama")[0]
    calib = sample_calibration_text(target, tmp_path / "calib.txt", sequences=32)
    settings = [f"{k}={v}" for k, v in {**TRAIN, **EXITING}.items()] + [f"calib_data={calib}"]
    compile_engine(CompileRequest(model=str(target), method="specee", output=tmp_path / "engine",
                                  max_seq_len=MAX_SEQ_LEN, settings=settings))
    loaded = load_engine(tmp_path / "engine")
    reused = assert_turns_reusing_match_hf_greedy(loaded, target, varied_prompts(1, 96, seed=5)[0] + [7, 9, 11],
                                                  MAX_NEW_TOKENS)
    assert reused[0] == 0 and reused[-1] > reused[1] > 0
    drafter = loaded.runtime.drafter
    kept = len(loaded._prefix.tokens)
    assert 0 < drafter.follower.valid <= kept, "the head holds no position the target's cache does not"
    assert bool(drafter.follower.feature_of(kept - 1).any()), "the last kept token's feature is kept"
    assert any(e < drafter.early.layerwise.num_layers - 1 for e in drafter.early.exit_layers)


@pytest.mark.shared_data
def test_ar_engines_are_marked_lossy(checkpoints, tmp_path):
    target = checkpoints("llama")[0]
    settings = [f"{k}={v}" for k, v in TRAIN.items()] + ["mode=ar", "train_steps=0"]
    report = compile_engine(CompileRequest(model=str(target), method="specee", output=tmp_path / "e",
                                           max_seq_len=MAX_SEQ_LEN, settings=settings))
    assert report["lossless"] is False


def test_bad_settings_are_clear_errors():
    with pytest.raises(UsageError, match="mode="):
        SpecEEConfig(mode="tree-ish")
    with pytest.raises(UsageError, match="kv_policy="):
        SpecEEConfig(kv_policy="drop")


@pytest.mark.shared_data
@pytest.mark.parametrize("backend", ["inductor", pytest.param("aoti", marks=pytest.mark.slow)])
def test_compiled_segments_match_hf_greedy(checkpoints, tmp_path, one_thread, backend):
    target = checkpoints("llama")[0]
    settings = [f"{k}={v}" for k, v in {**TRAIN, **EXITING}.items()]
    compile_engine(CompileRequest(model=str(target), method="specee", output=tmp_path / "e", backend=backend,
                                  max_seq_len=MAX_SEQ_LEN, settings=settings))
    loaded = load_engine(tmp_path / "e")
    assert_matches_hf_greedy(lambda ids: loaded.generate_ids(ids, MAX_NEW_TOKENS), target,
                             varied_prompts(8, 96, seed=11), MAX_NEW_TOKENS)
    assert any(e < 2 for e in loaded.runtime.drafter.early.exit_layers)


@pytest.mark.shared_data
def test_bfloat16_lossless_engine_matches_bfloat16_none(wide_checkpoint, tmp_path):
    """In bfloat16 only the target graph's padded calls are exact (`Backend.exact_rows`): a
    layer-by-layer step that ran every layer rounds its own way, so it is a draft like any other
    (taken as exact, 6 of these 10 prompts left `none`'s tokens)."""
    settings = [f"{k}={v}" for k, v in {**TRAIN, **EXITING}.items()]
    engines = {}
    for method, method_settings in (("none", []), ("specee", settings)):
        compile_engine(CompileRequest(model=str(wide_checkpoint), method=method, output=tmp_path / method,
                                      dtype="bfloat16", max_seq_len=MAX_SEQ_LEN, settings=method_settings))
        engines[method] = load_engine(tmp_path / method)
    assert engines["specee"].max_draft_rows == 4
    prompts = varied_prompts(10, 49152, seed=5)
    with torch.inference_mode(), torch_threads(2):   # kernels split rows across threads differently
        expected = [engines["none"].generate_ids(ids, 32).token_ids for ids in prompts]
        results = [engines["specee"].generate_ids(ids, 32) for ids in prompts]
    assert [r.token_ids for r in results] == expected
    assert sum(r.stats.accepted_tokens for r in results) > 0


def test_lossless_verifies_only_the_rows_after_the_first_exit(programs, one_thread):
    """With no exits every step is exact: each round's verification runs one row (the last token)."""
    checkpoint, program, state = programs("llama")
    target, drafter, _ = runtime(program, state, exit_threshold=0.999999, offline_layers=1, online_tokens=0)
    rows = []
    forward = target.full.forward_fn
    target.full.forward_fn = lambda tokens, *rest: rows.append(tokens.shape[1]) or forward(tokens, *rest)
    results = assert_identical(target, drafter, checkpoint)
    assert set(drafter.early.exit_layers) == {drafter.early.layerwise.num_layers - 1}
    rounds = sum(r.stats.target_forward_passes for r in results) - len(results)   # minus the prefills
    prompt_rows = sum(len(ids) for ids in varied_prompts(16, 96, seed=11))
    assert sum(rows) == prompt_rows + rounds, "a round verified rows its drafter had computed exactly"


def test_the_exit_threshold_is_calibrated_on_windows_the_predictors_never_saw():
    from specc.methods.specee.config import SpecEEConfig
    from specc.methods.specee.train import predictor_and_threshold_slices

    config = SpecEEConfig(predictor_windows=16, threshold_windows=8)
    assert predictor_and_threshold_slices(128, config) == (slice(0, 16), slice(16, 24))
    assert predictor_and_threshold_slices(20, config) == (slice(0, 16), slice(16, 20))
    assert predictor_and_threshold_slices(16, config) == (slice(0, 16), None)     # nothing left: own samples
    assert predictor_and_threshold_slices(128, SpecEEConfig(threshold_windows=0))[1] is None
