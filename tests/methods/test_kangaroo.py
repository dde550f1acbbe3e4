"""Kangaroo: trees, fixed steps and a reduced draft vocabulary token-identical to HF greedy, the
target's distribution when sampling with a reduced vocabulary or skipped rounds, shallow layers
run once per token, the engine round trip, and compile-time training that helps. Greedy
exactness on every family and backend, plain chain and tree sampling and seed determinism: the
conformance suite (tests/matrix)."""

from __future__ import annotations

import copy
import dataclasses

import torch.fx as fx

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specc.capture.load import load_model, load_tokenizer
from specc.cli.main import main
from specc.compiler import CompileRequest, build_program, compile_engine, training_context
from specc.contract.descriptor import get_method
from specc.contract.sampling import SamplingConfig
from specc.engine.loaded import load_engine
from specc.errors import SpeccError, UsageError
from specc.graph.nodes import layer_index
from specc.methods.kangaroo import KangarooConfig
from specc.methods.kangaroo.config import DRAFT_VOCABULARY_KEY
from specc.methods.kangaroo.runtime import build_runtime
from specc.methods.kangaroo.train import adapter_parameters, train_adapter
from specc.passes.manager import run_passes
from specc.passes.reduce_draft_vocabulary import DraftVocabularyConfig, ReduceDraftVocabulary
from specc.runtime.context import MethodContext
from specc.runtime.generate import generate
from specc.testing.checkpoints import (assert_matches_hf_greedy, assert_samples_the_target,
                           assert_turns_reusing_match_hf_greedy, build_tiny_checkpoint,
                           recording_drafted_tokens, recording_rounds, sample_calibration_text, trained_engines,
                           varied_prompts)

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
NUM_PROMPTS = 20
TRAIN = ["train_steps=40", "train_seq_len=32", "eval_sequences=2", "eval_every=20", "learning_rate=1e-2"]
VARIANTS = {
    "tree": dict(tree_width=3, tree_threshold=0.9),
    "fixed-steps": dict(exit_threshold=0.0, max_draft_steps=4),
    "wide-tree": dict(tree_width=4, tree_threshold=1.0, exit_threshold=0.0, max_draft_steps=3),
}


@pytest.fixture(scope="module")
def engines(checkpoints, tmp_path_factory):
    """(family, backend) -> (engine trained for a few steps, target checkpoint)."""
    return trained_engines("kangaroo", checkpoints, tmp_path_factory, TRAIN, MAX_SEQ_LEN)


def assert_identical(generate_ids, target: Path) -> list:
    return assert_matches_hf_greedy(generate_ids, target, varied_prompts(NUM_PROMPTS, 96, seed=11), MAX_NEW_TOKENS)


class Rows:
    """A graph forward that counts the query rows it is called with."""

    def __init__(self, forward):
        self.forward = forward
        self.rows = 0

    def __call__(self, input_ids, *rest):
        self.rows += input_ids.shape[1]
        return self.forward(input_ids, *rest)


def runtime(context: MethodContext, config: KangarooConfig, graphs: dict | None = None):
    """(target, drafter, rounds) over the context's graphs (or `graphs` in their place);
    `rounds` records (tree, accepted path) of every speculative round."""
    context = dataclasses.replace(context, graphs=graphs or context.graphs)
    return recording_rounds(build_runtime(context, config))


# --- losslessness ------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_trees_and_fixed_steps_match_hf_greedy(engines, one_thread, family, variant):
    engine, target = engines(family)
    model, drafter, rounds = runtime(engine.context, KangarooConfig(**VARIANTS[variant]))
    assert_identical(lambda ids: generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN), target)
    drafted = [(tree, path) for tree, path in rounds if tree.spec.depth]
    assert any(len(path) - 1 == tree.spec.depth for tree, path in drafted), "no round was fully accepted"
    assert any(len(path) == 1 for _, path in drafted), "no round was fully rejected"
    if "tree" in variant:
        assert any(node not in tree.chain_nodes for tree, path in rounds for node in path[1:]), \
            "no sibling was ever accepted; the tree lost coverage"


def test_reduced_draft_vocabulary_is_lossless_and_drafts_only_its_tokens(checkpoints, tmp_path, one_thread):
    target = checkpoints("llama")[0]
    calib = sample_calibration_text(target, tmp_path / "calib.txt", sequences=32)
    compile_engine(CompileRequest(model=str(target), method="kangaroo", output=tmp_path / "engine",
                                  max_seq_len=MAX_SEQ_LEN,
                                  settings=[*TRAIN, f"calib_data={calib}", "draft_vocab_size=40"]))
    engine = load_engine(tmp_path / "engine")
    ids = engine.method_state[DRAFT_VOCABULARY_KEY]
    assert len(ids) == 40 == len(set(ids)) and set(engine.architecture("adapter").eos_token_ids) <= set(ids)
    logits = [s for s in engine.context.signatures["adapter"].outputs if s.role == "logits"]
    assert logits[0].shape == (1, "r", 40)
    assert "reduce_draft_vocabulary" in [r["pass_name"] for r in engine.manifest["passes"] if r["graph"] == "adapter"]
    drafted = recording_drafted_tokens(engine.drafter)
    results = assert_identical(lambda ids_: engine.generate_ids(ids_, MAX_NEW_TOKENS), target)
    assert drafted and set(drafted) <= set(ids)
    assert sum(r.stats.accepted_tokens for r in results) > 0


@pytest.mark.shared_data
def test_the_papers_attention_only_adapter_is_lossless(checkpoints, tmp_path, one_thread):
    target = checkpoints("qwen3")[0]
    compile_engine(CompileRequest(model=str(target), method="kangaroo", output=tmp_path / "engine",
                                  max_seq_len=MAX_SEQ_LEN, settings=[*TRAIN, "adapter_mlp=false"]))
    engine = load_engine(tmp_path / "engine")
    added = load_file(str(engine.path / "weights" / "added.safetensors"))
    assert "adapter.self_attn.q_proj.weight" in added
    assert not any(".mlp." in name or "post_attention_layernorm" in name for name in added)
    results = assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)
    assert sum(r.stats.accepted_tokens for r in results) > 0


def test_a_turn_after_a_reused_prefix_matches_hf_greedy(engines, one_thread):
    """The adapter resumes from its KV and the exit states the last generation left."""
    engine, target = engines("llama")
    reused = assert_turns_reusing_match_hf_greedy(engine, target, varied_prompts(1, 96, seed=5)[0] + [7, 9, 11],
                                                  MAX_NEW_TOKENS)[-1]
    assert engine.drafter.follower.valid > reused


def test_under_an_exactness_cap_a_tree_config_drafts_chains(engines, one_thread):
    """Where verification is exact for chains only (`Backend.exact_rows`), the drafter must not
    spend the row budget on siblings: its exit states (DraftExits) cannot be cut behind its back."""
    engine, target = engines("llama")
    model, drafter, rounds = runtime(engine.context, KangarooConfig(**VARIANTS["wide-tree"]))
    assert_identical(lambda ids: generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN,
                                          max_rows=4), target)
    assert rounds and all(tree.spec.widths == (1,) * tree.spec.depth and tree.spec.depth <= 3 for tree, _ in rounds)
    assert any(tree.spec.depth == 3 for tree, _ in rounds)


@pytest.mark.slow
def test_aoti_packages_every_graph_and_matches_hf_greedy(engines, one_thread):
    engine, target = engines("llama", "aoti")
    packages = sorted(p.name for p in (engine.path / "compiled").iterdir())
    assert packages == [f"{graph}{suffix}" for graph in ("adapter", "deep", "shallow") for suffix in (".pt2", ".wide.pt2")]
    results = assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)
    assert sum(r.stats.accepted_tokens for r in results) > 0


# --- the shallow layers run once per token -------------------------------------


@pytest.mark.parametrize("variant", ["chain", "wide-tree"])
def test_verification_never_reruns_the_shallow_layers(engines, one_thread, variant):
    engine, _ = engines("llama")
    exit_layer = engine.method_state["exit_layer"]
    assert {layer_index(n) for n in engine.context.modules["shallow"].graph.nodes} - {None} == set(range(exit_layer))
    assert {layer_index(n) for n in engine.context.modules["deep"].graph.nodes} - {None} == set(range(exit_layer, 3))
    counted = {name: Rows(engine.context.graphs[name]) for name in ("shallow", "deep", "adapter")}
    config = KangarooConfig(**VARIANTS.get(variant, {}))
    model, drafter, rounds = runtime(engine.context, config, counted)
    for ids in varied_prompts(8, 96, seed=3):
        generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN)
    # The deep side sees every prefilled, verified or plainly decoded row once; the shallow
    # side must see each of them exactly once too: while drafting or else while verifying.
    assert counted["shallow"].rows == counted["deep"].rows
    fed_during_drafting = sum(tree.spec.depth for tree, _ in rounds)  # the root and all chain nodes but the last
    assert counted["shallow"].rows > fed_during_drafting > 0


def test_a_round_below_the_skip_threshold_is_a_plain_step_that_keeps_the_roots_exit(engines, one_thread):
    engine, target = engines("llama")
    counted = {name: Rows(engine.context.graphs[name]) for name in ("shallow", "deep", "adapter")}
    model, drafter, rounds = runtime(engine.context, KangarooConfig(skip_threshold=1.0), counted)
    results = assert_identical(
        lambda ids: generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN), target)
    assert sum(r.stats.drafted_tokens for r in results) == 0
    assert rounds and all(tree.spec.depth == 0 and path == [0] for tree, path in rounds)
    # Each root went through the shallow layers while drafting; verification did not repeat them.
    assert counted["shallow"].rows == counted["deep"].rows


def test_a_skip_threshold_drafts_fewer_tokens(engines, one_thread):
    engine, _ = engines("llama")
    counts = []
    for threshold in (0.0, 0.3):
        model, drafter, _ = runtime(engine.context, KangarooConfig(skip_threshold=threshold))
        drafted = recording_drafted_tokens(drafter)
        for ids in varied_prompts(8, 96, seed=5):
            generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN)
        counts.append(len(drafted))
    assert 0 < counts[1] < counts[0]


# --- sampling keeps the target distribution ------------------------------------


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A 16-token model with no EOS, its Kangaroo program (untrained adapter)."""
    checkpoint = build_tiny_checkpoint("llama", tmp_path_factory.mktemp("vocab16") / "model", seed=3,
                                       vocab_size=16, eos_token_id=None)
    model = load_model(checkpoint)
    program = build_program({"target": model}, get_method("kangaroo"), KangarooConfig(), MAX_SEQ_LEN)
    return model, program


# Plain chains and trees: the conformance suite (tests/matrix/test_sampling_matrix.py).
@pytest.mark.parametrize("variant,sampling", [
    ("reduced-chain", SamplingConfig(temperature=1.0)),
    ("reduced-tree", SamplingConfig(temperature=0.8, top_p=0.9)),
    ("skipping-chain", SamplingConfig(temperature=1.0)),
])
def test_sampling_matches_the_target_distribution(small_vocab, one_thread, variant, sampling):
    model, program = small_vocab
    settings = dict(exit_threshold=0.0, max_draft_steps=2, skip_threshold=0.0)
    if variant.startswith("skipping"):
        settings.update(skip_threshold=0.5)   # some rounds draft nothing
    if variant.endswith("tree"):
        settings.update(tree_width=3, tree_threshold=1.0)
    state = {}
    if variant.startswith("reduced"):
        # The draft head keeps 10 of the 16 rows: the rest can never be drafted, yet every
        # token must keep its target probability.
        program = copy.copy(program)
        program.graphs = dict(program.graphs)
        adapter = program.graphs["adapter"]
        ids = (3, 0, 7, 9, 1, 12, 5, 15, 8, 2)
        reduced, _ = run_passes("adapter", fx.GraphModule(adapter.module, copy.deepcopy(adapter.module.graph)),
                                [ReduceDraftVocabulary(DraftVocabularyConfig(ids))])
        program.graphs["adapter"] = dataclasses.replace(adapter, module=reduced)
        state = {DRAFT_VOCABULARY_KEY: list(ids)}
    context = MethodContext.eager(program, MAX_SEQ_LEN, state=state)
    target, drafter, rounds = runtime(context, KangarooConfig(**settings))
    assert_samples_the_target(model, target, drafter, rounds, sampling, MAX_SEQ_LEN)
    if variant.startswith("skipping"):
        assert {tree.spec.depth == 0 for tree, _ in rounds} == {True, False}, "no mix of skipped and drafted rounds"


# --- the engine ------------------------------------------------------------------


def test_engine_stores_the_adapter_once_with_its_training_report(engines):
    engine, _ = engines("llama")
    assert set(engine.manifest["graphs"]) == {"shallow", "deep", "adapter"}
    source = load_file(str(engine.path / "weights" / "target.safetensors"))
    added = load_file(str(engine.path / "weights" / "added.safetensors"))
    assert added and all(name.startswith("adapter.") for name in added)
    assert not any(name.startswith("adapter.") for name in source)
    loaded = dict(engine.context.modules["adapter"].named_buffers())
    for name, tensor in added.items():
        assert torch.equal(loaded[name], tensor)
    layer = engine.method_state["exit_layer"]
    for weight in ("self_attn.q_proj.weight", "mlp.down_proj.weight"):   # the adapter keeps layer l's MLP
        assert not torch.equal(added[f"adapter.{weight}"], source[f"model.layers.{layer}.{weight}"]), \
            f"training should have moved the adapter's {weight} away from its initial copy"
    training = engine.method_state["training"]
    assert training["steps"] == 40 and [e["step"] for e in training["heldout"]] == [0, 20, 40]
    assert training["seconds"] > 0


def test_config_fields_are_documented_and_validated(capsys):
    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    for field in ("exit_layer", "max_draft_steps: int = 6", "exit_threshold: float = 0.6", "tree_width",
                  "train_steps", "learning_rate", "calib_data", "seed"):
        assert field in listing
    for bad in ("tree_width=0", "exit_threshold=1.5", "max_draft_steps=0", "exit_layer=-1", "train_seq_len=1"):
        with pytest.raises(UsageError):
            KangarooConfig.from_assignments([bad])


def test_exit_layer_must_leave_layers_to_verify(checkpoints, tmp_path):
    request = CompileRequest(model=str(checkpoints("llama")[0]), method="kangaroo", output=tmp_path / "engine",
                             settings=["exit_layer=3", "train_steps=0"])
    with pytest.raises(SpeccError, match="exit_layer=3 must be below the model.s 3 layers"):
        compile_engine(request)


# --- compile-time training --------------------------------------------------------


@pytest.fixture(scope="module")
def trainable(checkpoints, tmp_path_factory):
    """A llama Kangaroo program, its initial adapter weights, tokenizer, calibration file."""
    target = checkpoints("llama")[0]
    calib = sample_calibration_text(target, tmp_path_factory.mktemp("calib") / "calib.txt", sequences=256)
    context = training_context({"target": load_model(target)}, get_method("kangaroo"), KangarooConfig(), MAX_SEQ_LEN)
    initial = {k: v.detach().clone() for k, v in adapter_parameters(context.program.graphs["adapter"].module).items()}
    return context, initial, load_tokenizer(target), calib


def train_from_initial(trainable, *settings: str):
    context, initial, tokenizer, calib = trainable
    with torch.no_grad():
        for name, p in adapter_parameters(context.program.graphs["adapter"].module).items():
            p.copy_(initial[name])
    config = KangarooConfig.from_assignments([f"calib_data={calib}", "train_seq_len=64", *settings])
    return train_adapter(context, config, tokenizer)


def test_training_lowers_loss_and_raises_heldout_acceptance(trainable, one_thread):
    result = train_from_initial(trainable, "train_steps=200", "learning_rate=1e-2", "eval_every=100")
    heldout = result.state["training"]["heldout"]
    untrained, trained = heldout[0], heldout[-1]
    assert trained["loss"] < untrained["loss"] - 0.1
    assert trained["acceptance"] > untrained["acceptance"]
    training = result.state["training"]
    assert training["train_loss_last"] < training["train_loss_first"]
