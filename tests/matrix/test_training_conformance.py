"""Training conformance: every registered method with a compile-time training (or
calibration) step is deterministic for a seed. Training twice from the same program with
the same config gives bitwise identical trained parameters and the same manifest state
(timings aside); where the seed drives training (initialisation, data order), another
seed gives other parameters. Tiny settings: a few steps on the tiny llama."""

from __future__ import annotations

import pytest
import torch

from specc.testing.checkpoints import sample_calibration_text

MAX_SEQ_LEN = 96
# Each training method's settings (the calibration text is added), and the config field whose
# change must change the trained parameters (None: the step takes no seed that drives it).
TRAINING: dict[str, tuple[list[str], str | None]] = {
    "draft-model": (["draft_vocab_size=24"], None),
    "eagle": (["train_steps=10", "train_seq_len=48", "draft_vocab_size=0"], "seed"),
    "firp": (["train_steps=8", "train_seq_len=48", "eval_sequences=4"], "seed"),
    "kangaroo": (["train_steps=12", "train_seq_len=64"], "seed"),
    "s3d": (["train_steps=12", "train_seq_len=64", "lora_mlp=true", "select=false"], "seed"),
    "specee": (["train_steps=8", "train_windows=8", "predictor_windows=4", "eval_sequences=2", "predictor_epochs=2",
                "train_seq_len=32", "eval_every=8", "draft_vocab_size=24"], "seed"),
    "swift": (["calib_prompts=2", "calib_max_new_tokens=12", "context_window=4", "max_tries_per_prompt=6",
               "draft_vocab_size=24"], None),
}


def without_timings(state):
    """The state with every timing (a key naming seconds) left out, at any depth."""
    if isinstance(state, dict):
        return {k: without_timings(v) for k, v in state.items()
                if not (isinstance(k, str) and "seconds" in k)}
    if isinstance(state, list):
        return [without_timings(v) for v in state]
    return state


@pytest.fixture(scope="module")
def calibration(checkpoints, tmp_path_factory):
    target = checkpoints("llama")[0]
    return sample_calibration_text(target, tmp_path_factory.mktemp("calib") / "calib.txt", sequences=32)


def test_every_registered_method_that_trains_is_covered(prompt_lookup_method):
    from specc.contract.descriptor import all_methods

    assert {m.name for m in all_methods() if m.train is not None} == set(TRAINING)


@pytest.mark.parametrize("method", sorted(TRAINING))
def test_training_is_deterministic_for_a_seed(checkpoints, calibration, one_thread, method):
    from specc.capture.load import load_model, load_tokenizer
    from specc.compiler import training_context
    from specc.contract.descriptor import get_method

    descriptor = get_method(method)
    target, draft = checkpoints("llama")
    settings, seed_field = TRAINING[method]
    settings = [*settings, f"calib_data={calibration}"]
    settings += [f"draft_model={draft}"] if any(s.name == "draft" for s in descriptor.extra_sources) else []
    models = {"target": load_model(target), **{s.name: load_model(draft) for s in descriptor.extra_sources}}
    tokenizer = load_tokenizer(target)

    def train(*more: str):
        config = descriptor.config_class.from_assignments([*settings, *more])
        # A fresh training program each time: training starts from the same initial parameters.
        return descriptor.train(training_context(models, descriptor, config, MAX_SEQ_LEN), config, tokenizer)

    seeded = [f"{seed_field}=5"] if seed_field else []
    first, again = train(*seeded), train(*seeded)
    assert first.weights, f"{method}: training produced no parameters"
    assert set(first.weights) == set(again.weights)
    assert all(torch.equal(first.weights[n], again.weights[n]) for n in first.weights), method
    assert without_timings(first.state) == without_timings(again.state)
    assert (first.config is None) == (again.config is None)
    if first.config is not None:
        assert first.config.to_json() == again.config.to_json()
    if seed_field:
        other = train(f"{seed_field}=6")
        assert not all(torch.equal(first.weights[n], other.weights[n]) for n in first.weights), \
            f"{method}: {seed_field} changed nothing"
