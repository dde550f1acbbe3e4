"""SpecEE tree mode: token-identical to HF greedy on every family when nothing exits, paths
that leave early with either KV policy, hyper-token acceptance, and the tree drafter's shape."""

from __future__ import annotations

import pytest
import torch

from specc.capture.load import load_model
from specc.compiler import build_program
from specc.contract.descriptor import get_method
from specc.contract.sampling import SamplingConfig
from specc.contract.tree import tree_from_parents
from specc.errors import UsageError
from specc.methods.specee import SpecEEConfig
from specc.methods.specee.hyper_token import HyperTokenVerifier, TreeDrafter, accept_paths
from specc.methods.specee.runtime import build_runtime
from specc.runtime.context import MethodContext
from specc.runtime.generate import generate
from specc.testing.checkpoints import FAMILIES, assert_matches_hf_greedy, build_tiny_checkpoint, varied_prompts

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
NEVER_EXIT = dict(exit_threshold=0.999999, offline_layers=1, online_tokens=0)
# Predictors fire everywhere and 64 of the 96 tokens are candidates, so the guard mostly passes.
ALWAYS_EXIT = dict(exit_threshold=0.001, offline_layers=64, candidates=64)


def tree_program(checkpoint, **settings):
    """An untrained tree-mode program: the head passes the feature through (some drafts accepted)."""
    config = SpecEEConfig(mode="tree", **settings)
    return build_program({"target": load_model(checkpoint)}, get_method("specee"), config, MAX_SEQ_LEN)


def runtime(program, **settings):
    built = build_runtime(MethodContext.eager(program, MAX_SEQ_LEN), SpecEEConfig(mode="tree", **settings))
    assert isinstance(built.target, HyperTokenVerifier) and isinstance(built.drafter, TreeDrafter)
    return built.target, built.drafter


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A 6-layer llama (predictors after layers 2..4) and its tree-mode program with 64 candidates."""
    checkpoint = build_tiny_checkpoint("llama", tmp_path_factory.mktemp("deep") / "t", seed=0,
                                       num_hidden_layers=6)
    return checkpoint, tree_program(checkpoint, candidates=64)


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_mode_without_exits_matches_hf_greedy(checkpoints, one_thread, family):
    checkpoint = checkpoints(family)[0]
    target, drafter = runtime(tree_program(checkpoint), **NEVER_EXIT)
    results = assert_matches_hf_greedy(
        lambda ids: generate(target, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN),
        checkpoint, varied_prompts(16, 96, seed=11), MAX_NEW_TOKENS)
    report = target.method_report()
    assert set(report["layers_executed"]) == {target.early.layerwise.num_layers}
    assert sum(r.stats.drafted_tokens for r in results) > sum(r.stats.accepted_tokens for r in results) > 0


@pytest.mark.parametrize("kv_policy", ["propagate", "mask"])
def test_paths_leave_early_and_output_stays_valid(deep, one_thread, kv_policy):
    checkpoint, program = deep
    target, drafter = runtime(program, kv_policy=kv_policy, **ALWAYS_EXIT)
    layers = target.early.layerwise.num_layers
    for prompt in varied_prompts(4, 96, seed=3):
        result = generate(target, drafter, prompt, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN)
        assert len(result.token_ids) >= 1 and all(0 <= t < 96 for t in result.token_ids)
        assert result.stats.new_tokens == len(result.token_ids)
    report = target.method_report()
    assert min(report["layers_executed"]) < layers, "no tree forward stopped early: the test lost its meaning"
    assert min(report["accepted_path_layers"]) < layers and report["guard_checks"] > 0
    if kv_policy == "mask":
        assert bool(target.early.missing.any())


def test_committed_rows_hold_kv_at_every_layer_when_paths_leave_early(deep, one_thread):
    """`propagate`: every committed slot's K/V is written at every layer, whichever layer its
    path left at (a row still holding the sentinel was never written)."""
    checkpoint, program = deep
    target, drafter = runtime(program, kv_policy="propagate", **ALWAYS_EXIT)
    sentinel = 1234.5
    for cache in target.full.cache.tensors:
        cache.fill_(sentinel)
    prompt = varied_prompts(1, 96, seed=4)[0]
    result = generate(target, drafter, prompt, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN)
    committed = len(prompt) + len(result.token_ids) - 1    # the last token's K/V is never written
    assert min(target.method_report()["accepted_path_layers"]) < target.early.layerwise.num_layers
    for cache in target.full.cache.tensors:
        assert not bool((cache[:, :, :committed] == sentinel).all(-1).any())


def test_the_tree_warm_up_leaves_no_state_behind(checkpoints, one_thread):
    from specc.methods.specee.runtime import warm_up_tree

    checkpoint = checkpoints("llama")[0]
    target, drafter = runtime(tree_program(checkpoint), **NEVER_EXIT)
    warm_up_tree(target, drafter)
    assert target.method_report()["tree_rounds"] == 0 and drafter.follower.valid == 0
    assert not bool(drafter.follower.features.any()), "the warm-up keeps no feature"
    assert_matches_hf_greedy(
        lambda ids: generate(target, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN),
        checkpoint, varied_prompts(16, 96, seed=11), MAX_NEW_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "aoti", "onnx"])
def test_tree_mode_compiled_matches_hf_greedy(checkpoints, tmp_path, one_thread, backend):
    from specc.compiler import CompileRequest, compile_engine
    from specc.engine.loaded import load_engine

    checkpoint = checkpoints("llama")[0]
    settings = ["mode=tree", "train_steps=0", "train_windows=2", "predictor_windows=1", "eval_sequences=1",
                "predictor_epochs=1", "train_seq_len=32"] + [f"{k}={v}" for k, v in NEVER_EXIT.items()]
    compile_engine(CompileRequest(model=str(checkpoint), method="specee", output=tmp_path / "e",
                                  backend=backend, max_seq_len=MAX_SEQ_LEN, settings=settings))
    loaded = load_engine(tmp_path / "e")
    assert loaded.manifest["lossless"] is False
    assert_matches_hf_greedy(lambda ids: loaded.generate_ids(ids, MAX_NEW_TOKENS), checkpoint,
                             varied_prompts(16, 96, seed=11), MAX_NEW_TOKENS)


def test_never_exiting_tree_verification_equals_the_full_model(deep, one_thread):
    """The logits each node is read at are the full model's when no path leaves early."""
    checkpoint, program = deep
    target, drafter = runtime(program, **NEVER_EXIT, candidates=64)
    prompt = varied_prompts(1, 96, seed=5)[0]
    with torch.inference_mode():
        prefill = target.prefill(torch.tensor(prompt), 0)
        drafter.begin(torch.tensor(prompt), prefill)
        tokens = prompt + [int(prefill.logits[-1].argmax())]
        draft = drafter.propose(tokens, _budget(), SamplingConfig(), None)
        tree_rows = target.verify_tree(draft, len(tokens) - 1)
        reference = target.full.verify_tree(draft, len(tokens) - 1)    # the full model on the same prefix
    assert draft.node_tokens.numel() == 1 + 3 * 2 and len(draft.tree.paths) >= 2
    torch.testing.assert_close(tree_rows.logits, reference.logits, rtol=1e-4, atol=1e-4)


def test_each_path_is_accepted_against_its_own_exit_logits():
    # root 0 → 2 and root 0 → 1 → 3: two paths, in leaf order.
    tree = tree_from_parents((-1, 0, 0, 1))
    assert tree.paths == ((0, 2), (0, 1, 3)) and tree.children(0) == (1, 2) and tree.spec.widths == (2, 1)
    tokens = torch.tensor([7, 4, 5, 6])

    def rows(*argmaxes):
        return torch.nn.functional.one_hot(torch.tensor(argmaxes), 10).float()

    # Path (0, 1, 3) read at its exit: after 7 comes 4, after 4 comes 9 (6 rejected, bonus 9).
    # Path (0, 2) read at its own (different) exit: after 7 comes 5, then the bonus 8: as long.
    acceptance, best = accept_paths(tree, tokens, {0: rows(5, 8), 1: rows(4, 9, 0)})
    assert (acceptance.path, acceptance.next_token, best) == ([0, 2], 8, 0)
    acceptance, best = accept_paths(tree, tokens, {0: rows(5, 8), 1: rows(4, 6, 2)})
    assert (acceptance.path, acceptance.next_token, best) == ([0, 1, 3], 2, 1)
    # The root's row differs per path: each path is judged by its own.
    acceptance, best = accept_paths(tree, tokens, {0: rows(1, 8), 1: rows(4, 9, 0)})
    assert (acceptance.path, acceptance.next_token, best) == ([0, 1], 9, 1)


def test_tree_mode_needs_a_tree_engine_and_greedy_decoding(checkpoints, one_thread):
    checkpoint = checkpoints("llama")[0]
    ar_program = build_program({"target": load_model(checkpoint)}, get_method("specee"), SpecEEConfig(mode="ar"),
                               MAX_SEQ_LEN)
    with pytest.raises(UsageError, match="mode=tree"):
        build_runtime(MethodContext.eager(ar_program, MAX_SEQ_LEN), SpecEEConfig(mode="tree"))
    target, drafter = runtime(tree_program(checkpoint))
    with pytest.raises(UsageError, match="greedily"):
        generate(target, drafter, [5, 9, 7], 8, SamplingConfig(temperature=1.0, seed=0), MAX_SEQ_LEN)
    with pytest.raises(UsageError, match="tree_width"):
        SpecEEConfig(mode="tree", tree_width=0)


def _budget():
    from specc.contract.drafter import DraftBudget

    return DraftBudget(max_depth=8, max_nodes=64)
