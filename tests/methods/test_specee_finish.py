"""SpecEE `kv_policy=finish` (mode=ar): an exited token's remaining layers run beside the next
token that goes deeper, so the engine's K/V and its full-depth steps equal the dense model's."""

from __future__ import annotations

import pytest
import torch

from specc.capture.load import load_model
from specc.compiler import build_program
from specc.errors import UsageError
from specc.contract.descriptor import get_method
from specc.methods.specee import SpecEEConfig
from specc.methods.specee.runtime import EarlyExitTarget, build_runtime
from specc.runtime.context import MethodContext
from specc.testing.checkpoints import build_tiny_checkpoint, varied_prompts

MAX_SEQ_LEN = 96
# Forced exit layers per step on a 6-layer model (predictors after layers 2..4; 5: no exit).
# Consecutive exits at different layers leave several rows pending with different resume layers;
# a later step that exits above them finishes some and leaves them pending from its own exit.
EXITS = [2, 4, 5, 3, 2, 4, 2, 5, 3, 3, 5, 4, 2, 3, 4, 5, 2, 2, 2, 4]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def deep(request, tmp_path_factory):
    checkpoint = build_tiny_checkpoint(request.param, tmp_path_factory.mktemp("deep") / "t", seed=0,
                                       num_hidden_layers=6)
    config = SpecEEConfig(mode="ar")
    return build_program({"target": load_model(checkpoint)}, get_method("specee"), config, MAX_SEQ_LEN)


def ar_target(program, kv_policy: str) -> EarlyExitTarget:
    built = build_runtime(MethodContext.eager(program, MAX_SEQ_LEN), SpecEEConfig(mode="ar", kv_policy=kv_policy))
    assert built.drafter is None
    return built.target


def run_forced_exits(target: EarlyExitTarget, prompt: list[int]) -> tuple[list[int], list[tuple]]:
    """Greedy ar steps exiting at `EXITS`; the sequence and each step's (slot, exit layer, logits)."""
    sequence = prompt + [int(target.prefill(torch.tensor(prompt), 0).logits[-1].argmax())]
    steps = []
    for layer in EXITS:
        slot = len(sequence) - 1
        result = target.early.step(sequence[-1], slot, target.feature, force_exit=layer)
        target.feature = result.hidden[0, -1]
        steps.append((slot, result.exit_layer, result.logits[0, -1]))
        sequence.append(int(result.logits[0, -1].argmax()))
    return sequence, steps


def dense_replay(target: EarlyExitTarget, sequence: list[int]):
    """The full model on the whole sequence from an empty context: logits per slot, and its caches."""
    logits = target.full.run_chunk(torch.tensor(sequence), 0).logits
    return logits, [c.clone() for c in target.full.cache.tensors]


@torch.inference_mode()
def test_full_depth_steps_and_every_kv_equal_the_dense_model(deep, one_thread):
    target = ar_target(deep, "finish")
    sequence, steps = run_forced_exits(target, varied_prompts(1, 96, seed=4)[0])
    assert target.early.finishing.pending, "the pattern should end with rows pending"
    # A chunk the full model runs first finishes every pending row.
    written = len(sequence) - 1
    target.prefill(torch.tensor(sequence[-1:] + [7]), written)
    engine_caches = [c.clone() for c in target.full.cache.tensors]
    assert not target.early.finishing.pending
    dense_logits, dense_caches = dense_replay(target, sequence[:-1])
    top = target.early.layerwise.num_layers - 1
    full_steps = [(slot, logits) for slot, layer, logits in steps if layer == top]
    assert len(full_steps) == EXITS.count(5)
    for slot, logits in full_steps:
        torch.testing.assert_close(logits, dense_logits[slot], rtol=1e-4, atol=1e-4)
    for engine, dense in zip(engine_caches, dense_caches):
        torch.testing.assert_close(engine[:, :, :written], dense[:, :, :written], rtol=1e-4, atol=1e-4)
    assert target.method_report()["finished_row_layers"] > 0


@torch.inference_mode()
def test_propagated_kv_is_not_the_dense_models(deep, one_thread):
    """The comparison above has teeth: under `propagate` the same steps leave other K/V."""
    target = ar_target(deep, "propagate")
    sequence, _ = run_forced_exits(target, varied_prompts(1, 96, seed=4)[0])
    written = len(sequence) - 1
    engine_caches = [c.clone() for c in target.full.cache.tensors]
    _, dense_caches = dense_replay(target, sequence[:-1])
    assert any(not torch.allclose(e[:, :, :written], d[:, :, :written], rtol=1e-4, atol=1e-4)
               for e, d in zip(engine_caches, dense_caches))


@torch.inference_mode()
def test_a_new_sequence_drops_rows_left_pending(deep, one_thread):
    target = ar_target(deep, "finish")
    run_forced_exits(target, varied_prompts(1, 96, seed=4)[0])
    assert target.early.finishing.pending
    target.prefill(torch.tensor([3, 4, 5]), 0)
    assert not target.early.finishing.pending


def test_auto_is_finish_in_ar_mode_and_propagate_elsewhere():
    assert SpecEEConfig(mode="ar").resolved_kv_policy == "finish"
    assert SpecEEConfig(mode="lossless").resolved_kv_policy == "propagate"
    assert SpecEEConfig(mode="tree").resolved_kv_policy == "propagate"
    assert SpecEEConfig(mode="ar", kv_policy="mask").resolved_kv_policy == "mask"


def test_finish_is_for_ar_mode_only():
    with pytest.raises(UsageError, match="kv_policy=finish needs mode=ar"):
        SpecEEConfig(mode="lossless", kv_policy="finish")
    with pytest.raises(UsageError, match="kv_policy=finish needs mode=ar"):
        SpecEEConfig(mode="tree", kv_policy="finish")
