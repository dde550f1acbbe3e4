"""eagle: EAGLE-2 dynamic trees and chains token-identical to HF greedy, its bfloat16 engine
identical to its bfloat16 `none` engine, composition with prompt lookup, and compile-time training
with training-time test. Greedy exactness on every family and backend, sampling and seed
determinism: the conformance suite (tests/matrix)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from specc.capture.load import load_model, load_tokenizer
from specc.cli.main import main
from specc.compiler import CompileRequest, compile_engine, training_context
from specc.contract.descriptor import get_method
from specc.contract.sampling import SamplingConfig
from specc.engine.composition import engine_runtime
from specc.engine.loaded import load_engine
from specc.errors import SpeccError, UsageError
from specc.methods.eagle import EagleConfig, METHOD, runtime as eagle_runtime
from specc.methods.eagle.config import default_layers
from specc.methods.eagle.runtime import build_runtime
from specc.methods.eagle.train import head_parameters, train_head
from specc.runtime.context import MethodContext
from specc.runtime.generate import generate
from specc.testing.checkpoints import (FAMILIES, assert_matches_hf_greedy,
                                       assert_turns_reusing_match_hf_greedy,
                                       recording_rounds, sample_calibration_text,
                                       trained_engines, varied_prompts)

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
NUM_PROMPTS = 20
TRAIN = ["train_steps=60", "train_seq_len=32", "eval_sequences=2", "eval_every=30", "learning_rate=1e-2",
         "draft_vocab_size=48"]


@pytest.fixture(scope="module")
def engines(checkpoints, tmp_path_factory):
    """(family, backend) -> (engine trained for a few steps, target checkpoint)."""
    return trained_engines("eagle", checkpoints, tmp_path_factory, TRAIN, MAX_SEQ_LEN)


def assert_identical(generate_ids, target) -> list:
    return assert_matches_hf_greedy(generate_ids, target, varied_prompts(NUM_PROMPTS, 96, seed=11), MAX_NEW_TOKENS)


def runtime(context: MethodContext, config: EagleConfig):
    """(target, drafter, rounds) for `config` over the context's graphs; `rounds` records
    (tree, accepted path) of every speculative round."""
    return recording_rounds(build_runtime(context, config))


def greedy(model, drafter, max_rows=None):
    return lambda ids: generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN, max_rows=max_rows)


# --- losslessness ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_aoti_packages_both_graphs_and_matches_hf_greedy(engines, one_thread, family):
    engine, target = engines(family, "aoti")
    packages = {p.name.split(".")[0] for p in (engine.path / "compiled").iterdir()}
    assert packages == {"head", "target"}
    results = assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)
    assert sum(r.stats.accepted_tokens for r in results) > 0


@pytest.mark.parametrize("variant", [
    dict(tree_width=1, depth=4),                       # a chain
    dict(tree_width=3, tree_nodes=10, depth=4),        # a narrow dynamic tree
    dict(tree_width=6, tree_nodes=40, depth=6),        # a wide one
])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_trees_and_chains_match_hf_greedy(engines, one_thread, family, variant):
    engine, target = engines(family)
    config = EagleConfig(**variant, stop_probability=0.0)   # the full growth, however unsure the head
    model, drafter, rounds = runtime(engine.context, config)
    assert_identical(greedy(model, drafter), target)
    trees = [tree for tree, _ in rounds]
    assert all(len(tree.parent) - 1 <= (config.depth if config.tree_width == 1 else config.tree_nodes)
               for tree in trees)
    assert all(tree.spec.depth <= config.depth for tree in trees)
    if config.tree_width > 1:
        assert any(not _caterpillar(tree) for tree in trees), "the dynamic tree never left the chain-and-fans shape"
        assert any(node not in tree.chain_nodes for tree, path in rounds for node in path[1:]), \
            "no node off the first-child chain was ever accepted; the tree lost coverage"


def _caterpillar(tree) -> bool:
    """Whether only first-child-chain nodes have children (a top-1 chain with sibling fans)."""
    inner = set(tree.parent[1:])
    return inner <= {0, *tree.chain_nodes}


def test_under_an_exactness_cap_the_tree_config_drafts_chains(engines, one_thread):
    engine, target = engines("llama")
    model, drafter, rounds = runtime(engine.context, EagleConfig(tree_width=4, tree_nodes=24, depth=6,
                                                                 stop_probability=0.0))
    assert_identical(greedy(model, drafter, max_rows=4), target)
    assert rounds and all(tree.spec.widths == (1,) * tree.spec.depth and tree.spec.depth <= 3 for tree, _ in rounds)
    assert any(tree.spec.depth == 3 for tree, _ in rounds)


@pytest.mark.parametrize("tree_width", [1, 3])
def test_unsure_drafts_stop_early_and_stay_lossless(engines, one_thread, tree_width):
    """A stop probability above anything the head gives stops every round at depth 1; a
    moderate one shortens some rounds only; both verify to the same tokens."""
    engine, target = engines("llama")
    depths = {}
    for stop in (0.0, 0.3, 0.999):
        config = EagleConfig(tree_width=tree_width, tree_nodes=12, depth=5, stop_probability=stop)
        model, drafter, rounds = runtime(engine.context, config)
        assert_identical(greedy(model, drafter), target)
        depths[stop] = [tree.spec.depth for tree, _ in rounds]
    assert set(depths[0.999]) == {1}
    assert max(depths[0.0]) > 1 and sum(depths[0.3]) < sum(depths[0.0])


def test_bfloat16_engine_matches_its_none_engine(checkpoints, tmp_path, one_thread):
    target = checkpoints("llama")[0]
    calib = sample_calibration_text(target, tmp_path / "calib.txt", sequences=32)
    tokens = {}
    for method, settings in (("none", []), ("eagle", [*TRAIN, f"calib_data={calib}"])):
        compile_engine(CompileRequest(model=str(target), method=method, output=tmp_path / method, dtype="bfloat16",
                                      max_seq_len=MAX_SEQ_LEN, settings=settings))
        engine = load_engine(tmp_path / method)
        results = [engine.generate_ids(ids, MAX_NEW_TOKENS) for ids in varied_prompts(NUM_PROMPTS, 96, seed=11)]
        tokens[method] = [r.token_ids for r in results]
        if method == "eagle":
            assert engine.manifest["lossless"] is True
            assert sum(r.stats.accepted_tokens for r in results) > 0
    assert tokens["eagle"] == tokens["none"]


# --- composition with prompt lookup ----------------------------------------------


@pytest.mark.parametrize("max_rows", [None, 4])
def test_lookup_branch_shares_the_tree_and_stays_lossless(engines, one_thread, max_rows):
    engine, target = engines("llama")
    built = engine_runtime(METHOD, engine.context, EagleConfig(lookup=True, tree_width=2, tree_nodes=8, depth=4))
    model, drafter = built.target, built.drafter
    assert_identical(greedy(model, drafter, max_rows), target)
    report = drafter.method_report()
    branches = report["branches"]
    assert set(branches) == {"eagle", "lookup"}
    assert branches["eagle"]["accepted_tokens"] > 0
    assert branches["lookup"]["proposed_tokens"] > 0


def test_a_turn_after_a_reused_prefix_matches_hf_greedy(engines, one_thread):
    """The head resumes from the features and head KV the last generation left."""
    engine, target = engines("llama")
    reused = assert_turns_reusing_match_hf_greedy(engine, target, varied_prompts(1, 96, seed=5)[0] + [7, 9, 11],
                                                  MAX_NEW_TOKENS)[-1]
    assert engine.drafter.follower.valid > reused


def test_a_catch_up_padded_to_a_row_multiple_computes_what_an_unpadded_one_does(engines, one_thread, monkeypatch):
    """A catch-up over 13 positions runs as 16 rows, the root's repeated (`catch_up_rows`): the
    root's logits and hidden state and the head's K/V at those positions are those of 13 rows."""
    engine, _ = engines("llama")
    drafter = engine.drafter
    prompt = [(7 * i + 3) % 90 + 4 for i in range(13)]
    engine.generate_ids(prompt, 2)   # the target's features at the prompt's positions
    assert eagle_runtime.catch_up_rows(13) == 16 and eagle_runtime.catch_up_rows(3) == 3

    def catch_up(rows_for):
        monkeypatch.setattr(eagle_runtime, "catch_up_rows", rows_for)
        drafter.follower.valid = 0
        logits, hidden = drafter._catch_up(prompt, len(prompt) - 1)
        return [logits, hidden, *(cache[:, :, :len(prompt)].clone() for cache in drafter.head.cache.tensors)]

    padded, plain = catch_up(eagle_runtime.catch_up_rows), catch_up(lambda count: count)
    for padded_tensor, plain_tensor in zip(padded, plain):
        torch.testing.assert_close(padded_tensor, plain_tensor)


def test_lookup_setting_builds_a_composed_engine(checkpoints, tmp_path, one_thread):
    target = checkpoints("llama")[0]
    compile_engine(CompileRequest(model=str(target), method="eagle", output=tmp_path / "engine",
                                  max_seq_len=MAX_SEQ_LEN, settings=["train_steps=0", "lookup=true"]))
    engine = load_engine(tmp_path / "engine")
    assert type(engine.drafter).__name__ == "ComposedDrafter"
    assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)


def test_a_lookup_corpus_is_kept_in_the_engine_and_drafts_as_a_third_branch(checkpoints, tmp_path, one_thread,
                                                                             capsys):
    target = checkpoints("llama")[0]
    corpus = sample_calibration_text(target, tmp_path / "written.txt", 16, temperature=0.01)
    compile_engine(CompileRequest(model=str(target), method="eagle", output=tmp_path / "engine",
                                  max_seq_len=MAX_SEQ_LEN,
                                  settings=["train_steps=0", "lookup=true", f"lookup_corpus={corpus}"]))
    engine = load_engine(tmp_path / "engine")
    stored = engine.method_state["lookup_corpus"]
    assert len(stored) == 16 and all(isinstance(t, int) for t in stored[0])
    assert list(engine.drafter.branches) == ["eagle", "lookup", "corpus"]
    assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)
    assert engine.drafter.method_report()["branches"]["corpus"]["accepted_tokens"] > 0
    assert main(["inspect", str(tmp_path / "engine")]) == 0
    assert "lookup_corpus: [[" in capsys.readouterr().out


def test_a_missing_or_builtin_lookup_corpus_is_refused_before_loading(checkpoints, tmp_path):
    with pytest.raises(UsageError, match="lookup_corpus=.*no such file"):
        compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="eagle", output=tmp_path / "e",
                                      max_seq_len=MAX_SEQ_LEN, settings=[f"lookup_corpus={tmp_path}/none.jsonl"]))
    with pytest.raises(UsageError, match="text the target wrote"):
        compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="eagle", output=tmp_path / "e",
                                      max_seq_len=MAX_SEQ_LEN, settings=["lookup_corpus=builtin"]))
    assert not (tmp_path / "e").exists()


# --- the engine ------------------------------------------------------------------


def test_engine_stores_the_head_and_fusion_with_their_training_report(engines):
    engine, _ = engines("llama")
    assert set(engine.manifest["graphs"]) == {"target", "head"}
    added = load_file(str(engine.path / "weights" / "added.safetensors"))
    assert "eagle.fc.weight" in added and "eagle.midlayer.self_attn.q_proj.weight" in added
    assert "draft_head.weight" in added
    target_buffers = dict(engine.context.modules["target"].named_buffers())
    assert torch.equal(target_buffers["eagle.fc.weight"], added["eagle.fc.weight"])
    head_buffers = dict(engine.context.modules["head"].named_buffers())
    assert torch.equal(head_buffers["eagle.norm.weight"], added["eagle.norm.weight"])
    hidden = added["eagle.norm.weight"].shape[0]
    initial = torch.cat([torch.zeros(hidden, 2 * hidden), torch.eye(hidden)], dim=1)
    assert not torch.allclose(added["eagle.fc.weight"].float(), initial), "training should have moved the fusion"
    state = engine.method_state
    assert state["fused_layers"] == list(default_layers(3))
    training = state["training"]
    assert training["steps"] == 60 and len(training["heldout_by_depth"]) == 3


def test_inspect_shows_the_fused_layers_and_per_depth_agreement(engines, capsys):
    engine, _ = engines("llama")
    assert main(["inspect", str(engine.path)]) == 0
    out = capsys.readouterr().out
    assert "fused_layers" in out and "heldout_by_depth" in out


def test_config_fields_are_documented_and_validated(capsys):
    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    for field in ("fused_layers", "tree_width", "tree_nodes", "stop_probability", "lookup", "ttt_steps", "calib_data"):
        assert field in listing
    for bad in ("tree_width=0", "depth=0", "fused_layers=1,2", "fused_layers=a,b,c", "fused_layers=0,1,2",
                "ttt_steps=0", "tree_nodes=0", "stop_probability=1", "stop_probability=-0.1"):
        with pytest.raises(UsageError):
            EagleConfig.from_assignments([bad])


def test_fused_layers_must_exist_in_the_model(checkpoints, tmp_path):
    request = CompileRequest(model=str(checkpoints("llama")[0]), method="eagle", output=tmp_path / "engine",
                             settings=["fused_layers=1,2,4", "train_steps=0"])
    with pytest.raises(SpeccError, match="fused_layers=1,2,4 must name layers 1..3"):
        compile_engine(request)
    assert not (tmp_path / "engine").exists()


def test_default_layers_follow_eagle3_and_stay_inside_shallow_models():
    assert default_layers(32) == (2, 16, 29)
    assert default_layers(30) == (2, 15, 27)
    assert default_layers(6) == (2, 3, 4) and default_layers(4) == (1, 2, 3)
    assert default_layers(3) == (1, 1, 2)   # too shallow for three distinct layers


# --- compile-time training --------------------------------------------------------


@pytest.fixture(scope="module")
def trainable(checkpoints, tmp_path_factory):
    """A llama eagle training context, its initial head and fusion weights, tokenizer, calibration file."""
    target = checkpoints("llama")[0]
    calib = sample_calibration_text(target, tmp_path_factory.mktemp("calib") / "calib.txt", sequences=256)
    context = training_context({"target": load_model(target)}, get_method("eagle"), EagleConfig(), MAX_SEQ_LEN)
    return context, _weights(context), load_tokenizer(target), calib


def _weights(context) -> dict[str, torch.Tensor]:
    head = head_parameters(context.program.graphs["head"].module)
    fc = context.program.graphs["target"].module.get_parameter("eagle.fc.weight")
    return {name: p.detach().clone() for name, p in {**head, "eagle.fc.weight": fc}.items()}


def train_from_initial(trainable, *settings: str):
    context, initial, tokenizer, calib = trainable
    parameters = {**head_parameters(context.program.graphs["head"].module),
                  "eagle.fc.weight": context.program.graphs["target"].module.get_parameter("eagle.fc.weight")}
    with torch.no_grad():
        for name, p in parameters.items():
            p.copy_(initial[name])
    config = EagleConfig.from_assignments([f"calib_data={calib}", "train_seq_len=48", "draft_vocab_size=0",
                                           *settings])
    return train_head(context, config, tokenizer)


def test_training_with_training_time_test_raises_every_depths_agreement(trainable, one_thread):
    result = train_from_initial(trainable, "train_steps=200", "learning_rate=1e-2", "eval_every=100")
    training = result.state["training"]
    assert training["heldout"][-1]["loss"] < training["heldout"][0]["loss"] - 0.1
    before, after = training["heldout_by_depth_initial"], training["heldout_by_depth"]
    assert len(after) == 3 and all(a > b for a, b in zip(after, before)), (before, after)
    assert training["train_loss_last"] < training["train_loss_first"]


def test_unrolled_steps_see_only_their_own_chain():
    from specc.methods.eagle.train import unrolled_attention

    mask = unrolled_attention(4, 2, "cpu")[0, 0]
    # step 3 (index 2): chain p sits at position p + 2, sees step-1 keys 0..p and slots 4 + p, 8 + p
    assert mask.shape == (2, 12)
    assert mask[0].nonzero().flatten().tolist() == [0, 4, 8]
    assert mask[1].nonzero().flatten().tolist() == [0, 1, 5, 9]


def test_dataclass_round_trip_keeps_every_field():
    config = EagleConfig(lookup=True, fused_layers="1,2,2", tree_width=2)
    assert EagleConfig.from_json(config.to_json()) == config
    assert dataclasses.asdict(config)["lookup"] is True
