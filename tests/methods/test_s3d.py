"""S3D: trees and longer drafts token-identical to HF greedy, verification that never applies
the draft-only adapters, the engine round trip, compile-time training that helps, and eq. 12's
choice. Greedy exactness on every family and backend, sampling and seed determinism: the
conformance suite (tests/matrix)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specc.capture.load import load_model, load_tokenizer
from specc.compiler import CompileRequest, build_program, compile_engine, training_context
from specc.contract.descriptor import get_method
from specc.contract.sampling import SamplingConfig
from specc.engine.loaded import load_engine
from specc.errors import SpeccError, UsageError
from specc.graph.nodes import layer_index
from specc.methods.s3d import S3DConfig
from specc.methods.s3d.select import Candidate
from specc.methods.s3d.train import draft_parameters, train_draft
from specc.runtime.context import MethodContext
from specc.runtime.generate import generate
from specc.runtime.speedup_model import tokens_per_round
from specc.testing.checkpoints import (assert_matches_hf_greedy, build_tiny_checkpoint,
                           recording_rounds, sample_calibration_text, trained_engines, varied_prompts)

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
TRAIN = ["train_steps=40", "train_seq_len=32", "eval_sequences=2", "eval_every=20", "learning_rate=1e-2",
         "select=false"]
METHOD = get_method("s3d")


@pytest.fixture(scope="module")
def engines(checkpoints, tmp_path_factory):
    """(family, backend) -> (engine trained for a few steps, target checkpoint)."""
    return trained_engines("s3d", checkpoints, tmp_path_factory, TRAIN, MAX_SEQ_LEN, temperature=0.5)


def assert_identical(generate_ids, target: Path) -> list:
    return assert_matches_hf_greedy(generate_ids, target, varied_prompts(20, 96, seed=11), MAX_NEW_TOKENS)


def runtime(context: MethodContext, config: S3DConfig):
    """(target, drafter, rounds): `rounds` records (tree, accepted path) of every speculative round."""
    built = METHOD.build_runtime(context, config)
    return recording_rounds(built)


# --- losslessness ------------------------------------------------------------


def test_a_round_drafts_at_most_draft_tokens(engines):
    """The default draft_tokens (4) bounds every round's draft (the engine's greedy exactness on
    every family and backend is the conformance suite's, tests/matrix)."""
    engine, _ = engines("llama")
    results = [engine.generate_ids(ids, MAX_NEW_TOKENS) for ids in varied_prompts(20, 96, seed=11)]
    assert max(r.stats.drafted_tokens / max(1, r.stats.target_forward_passes - 1) for r in results) <= 4


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_tree_and_longer_drafts_match_hf_greedy(engines, family):
    engine, target = engines(family)
    config = S3DConfig(draft_tokens=6, tree_width=3, tree_threshold=1.0)
    model, drafter, rounds = runtime(engine.context, config)
    assert_identical(lambda ids: generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN), target)
    assert any(node not in tree.chain_nodes for tree, path in rounds for node in path[1:]), \
        "no sibling was ever accepted; the tree lost coverage"
    assert any(len(path) == 1 for _, path in rounds), "no round was fully rejected"


@pytest.mark.slow
def test_aoti_packages_both_graphs_and_matches_hf_greedy(engines):
    engine, target = engines("llama", "aoti")
    assert sorted(p.name for p in (engine.path / "compiled").iterdir()) == ["draft.pt2", "draft.wide.pt2", "target.pt2", "target.wide.pt2"]
    results = assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)
    assert sum(r.stats.accepted_tokens for r in results) > 0


# --- the target never runs the draft's adapters ---------------------------------


@pytest.fixture(scope="module")
def llama_program(checkpoints):
    """An in-memory llama S3D program (untrained draft) and its target checkpoint."""
    target = checkpoints("llama")[0]
    return build_program({"target": load_model(target)}, METHOD, S3DConfig(), MAX_SEQ_LEN), target


def test_verification_never_applies_the_draft_adapters(llama_program):
    program, target = llama_program
    verifier = program.graphs["target"].module
    assert not [name for name, _ in verifier.named_parameters() if name.startswith("draft_")]
    assert not [n for n in verifier.graph.nodes if n.op == "get_attr" and str(n.target).startswith("draft_")]
    draft = program.graphs["draft"].module
    initial = {name: p.detach().clone() for name, p in draft_parameters(draft).items()}
    try:
        with torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            for p in draft_parameters(draft).values():
                p.copy_(torch.randn(p.shape, generator=generator) * 5.0)   # the draft's K/V are now far off
        model, drafter, rounds = runtime(MethodContext.eager(program, MAX_SEQ_LEN), S3DConfig())
        assert_identical(lambda ids: generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN),
                         target)
        assert rounds and sum(len(path) - 1 for _, path in rounds) < len(rounds)
    finally:
        with torch.no_grad():
            for name, p in draft_parameters(draft).items():
                p.copy_(initial[name])


def test_one_draft_forward_writes_only_kept_layers_at_the_draft_slots(llama_program):
    program, _ = llama_program
    model, drafter, _ = runtime(MethodContext.eager(program, MAX_SEQ_LEN), S3DConfig())
    prompt = torch.tensor(varied_prompts(1, 96, seed=5)[0] + [7, 8, 9])
    model.prefill(prompt, 0)
    kept = {layer_index(n) for n in program.graphs["draft"].module.graph.nodes} - {None}
    assert kept == {0, 2}
    root = prompt.numel()
    before = [t.clone() for t in model.cache.tensors]
    logits = drafter.predict(5, root, 4)
    assert logits.shape == (4, 96)
    for index, (old, new) in enumerate(zip(before, model.cache.tensors)):
        changed = (old != new).any(dim=(0, 1, 3)).nonzero().flatten().tolist()
        assert changed == (list(range(root, root + 4)) if index // 2 in kept else []), f"cache {index}"


# --- the engine ------------------------------------------------------------------


def test_engine_stores_the_draft_parameters_once_with_its_report(engines):
    engine, _ = engines("llama")
    assert set(engine.manifest["graphs"]) == {"target", "draft"}
    source = load_file(str(engine.path / "weights" / "target.safetensors"))
    added = load_file(str(engine.path / "weights" / "added.safetensors"))
    assert "draft_mask_token.weight" in added and any(name.startswith("draft_lora.") for name in added)
    assert all(name.startswith(("draft_lora.", "draft_mask_token.")) for name in added)
    assert not any(name.startswith("draft_") for name in source)
    assert any(added[name].any() for name in added if name.endswith("lora_b")), "training should move B off zero"
    state = engine.method_state
    assert state["skipped_layers"] == [1, 1] and state["kept_layers"] == [0, 2] and state["draft_tokens"] == 4
    agreement = state["heldout_agreement_by_position"]
    assert len(agreement["before"]) == len(agreement["after"]) == 4
    assert state["training"]["steps"] == 40 and state["training"]["seconds"] > 0 and state["train_seconds"] > 0
    passes = [r["pass_name"] for r in engine.manifest["passes"] if r["graph"] == "draft"]
    assert passes[-4:] == ["skip_middle_layers", "insert_mask_tokens", "attach_draft_lora", "select_logit_rows"]


def test_config_is_validated_naming_the_setting(checkpoints, tmp_path):
    for bad in ("draft_tokens=0", "skip_ratio=1.0", "skip_layers=0,1", "skip_layers=3", "lora_rank=0",
                "tree_width=0", "train_seq_len=1", "select_ratios=0.3,1.5", "select_max_tokens=0", "select_steps=0"):
        with pytest.raises(UsageError, match=bad.split("=")[0]):
            S3DConfig.from_assignments([bad])
    request = CompileRequest(model=str(checkpoints("llama")[0]), method="s3d", output=tmp_path / "engine",
                             settings=["skip_layers=1,2", "train_steps=0"])
    with pytest.raises(SpeccError, match="--set skip_layers=1,2 must keep the last layer"):
        compile_engine(request)


# --- compile-time training --------------------------------------------------------


@pytest.fixture(scope="module")
def trainable(checkpoints, tmp_path_factory):
    """A llama S3D program (adapters on the MLP too), its initial draft parameters, tokenizer, calibration."""
    target = checkpoints("llama")[0]
    calib = sample_calibration_text(target, tmp_path_factory.mktemp("calib") / "calib.txt", sequences=256,
                                    temperature=0.5)
    config = S3DConfig(lora_mlp=True)
    context = training_context({"target": load_model(target)}, METHOD, config, MAX_SEQ_LEN)
    initial = {k: v.detach().clone() for k, v in draft_parameters(context.program.graphs["draft"].module).items()}
    return context, initial, load_tokenizer(target), calib


def train_from_initial(trainable, *settings: str):
    context, initial, tokenizer, calib = trainable
    with torch.no_grad():
        for name, p in draft_parameters(context.program.graphs["draft"].module).items():
            p.copy_(initial[name])
    config = S3DConfig.from_assignments([f"calib_data={calib}", "train_seq_len=64", "lora_mlp=true", "select=false",
                                         *settings])
    return train_draft(context, config, tokenizer)


def test_training_lowers_loss_and_raises_heldout_agreement(trainable):
    result = train_from_initial(trainable, "train_steps=400", "learning_rate=1e-2", "eval_every=200")
    heldout = result.state["training"]["heldout"]
    assert heldout[-1]["loss"] < heldout[0]["loss"] - 0.1
    assert result.state["training"]["train_loss_last"] < result.state["training"]["train_loss_first"]
    by_position = result.state["heldout_agreement_by_position"]
    before, after = by_position["before"], by_position["after"]
    assert sum(after) > sum(before)
    assert sum(after[1:]) > sum(before[1:]), "the mask positions should improve"


# --- eq. 12 choice of the skipped block and γ ------------------------------------


def test_eq12_picks_the_block_and_gamma_with_the_largest_predicted_speedup():
    verify = [1.0, 1.2, 1.5, 2.0]                     # γ + 1 rows cost: 1, 2, 3, 4 rows
    shallow = Candidate((3, 4), None, [0.5] * 3, [0.9, 0.6, 0.3], [0.5, 0.55, 0.6])
    deep = Candidate((2, 5), None, [0.3] * 3, [0.8, 0.4, 0.2], [0.3, 0.33, 0.36])
    for candidate in (shallow, deep):
        by_gamma = {g: tokens_per_round(candidate.agreement[:g]) / (candidate.draft_cost[g - 1] + verify[g])
                    for g in (1, 2, 3)}
        assert candidate.best_gamma(verify) == max(by_gamma, key=by_gamma.get)
        assert candidate.improvement(2, verify) == pytest.approx(by_gamma[2])
    # γ = 1, τ = 1 + α₁: shallow 1.9 / 1.7 = 1.12, deep 1.8 / 1.5 = 1.20; the cheaper draft wins
    assert deep.improvement(1, verify) > shallow.improvement(1, verify)


@pytest.fixture(scope="module")
def deep_llama(tmp_path_factory):
    """A 6-layer tiny llama (several distinct centred blocks) and calibration text."""
    root = tmp_path_factory.mktemp("s3d-deep")
    target = build_tiny_checkpoint("llama", root / "target", seed=3, num_hidden_layers=6)
    return target, sample_calibration_text(target, root / "calib.txt", sequences=32, temperature=0.5)


def test_eq12_selection_times_and_pilots_every_candidate_and_the_engine_drafts_its_choice(deep_llama):
    target, calib = deep_llama
    config = S3DConfig.from_assignments([f"calib_data={calib}", "train_seq_len=32", "train_steps=6", "eval_every=3",
                                         "eval_sequences=2", "select_ratios=0.2,0.33,0.5", "select_max_tokens=3",
                                         "select_steps=4"])
    models, captures = {"target": load_model(target)}, {}
    result = METHOD.train(training_context(models, METHOD, config, MAX_SEQ_LEN, captures=captures), config,
                          load_tokenizer(target))
    selection = result.state["selection"]
    assert selection["costs_timed_with"] == selection["engine_lowered_for"] == {"backend": "eager", "device": "cpu"}
    blocks = [tuple(c["skipped_layers"]) for c in selection["candidates"]]
    assert blocks == [(2, 2), (2, 3), (1, 3)]          # 1, 2 and 3 of 6 layers, centred
    for candidate in selection["candidates"]:
        assert len(candidate["agreement_by_position"]) == len(candidate["draft_cost_by_gamma"]) == 3
        best = max(candidate["improvement_by_gamma"])
        assert best > 0 and all(0 < c < 2 for c in candidate["draft_cost_by_gamma"])
    # The report rounds each IF to 3 decimals, so a near-tie can round to equal values: the
    # selection must hold the largest rounded IF, not be the first candidate holding it.
    chosen = next(c for c in selection["candidates"] if c["skipped_layers"] == selection["skipped_layers"])
    assert max(chosen["improvement_by_gamma"]) == max(max(c["improvement_by_gamma"]) for c in selection["candidates"])
    gamma = selection["draft_tokens"]
    assert chosen["improvement_by_gamma"][gamma - 1] == max(chosen["improvement_by_gamma"])
    assert result.config.skip_layers == tuple(chosen["skipped_layers"]) and result.config.draft_tokens == gamma
    first, last = chosen["skipped_layers"]
    assert result.state["skipped_layers"] == [first, last]
    # The engine's program, built from the chosen config, drafts through the chosen block.
    program = build_program(models, METHOD, result.config, MAX_SEQ_LEN, captures=captures, state=result.state)
    draft = program.graphs["draft"].module
    kept = sorted({layer_index(n) for n in draft.graph.nodes} - {None})
    assert kept == [i for i in range(6) if not first <= i <= last]
    assert set(result.weights) == set(draft_parameters(draft))
    records = program.records_of("draft")
    assert [r.pass_name for r in records][-3:] == ["skip_middle_layers", "insert_mask_tokens", "attach_draft_lora"]
    assert len(records) == len(program.records_of("target")) + 3


def test_eq12_engine_records_its_choice_and_matches_hf_greedy(deep_llama, tmp_path):
    target, calib = deep_llama
    compile_engine(CompileRequest(model=str(target), method="s3d", output=tmp_path / "engine", max_seq_len=MAX_SEQ_LEN,
                                  settings=[f"calib_data={calib}", "train_seq_len=32", "train_steps=4",
                                            "eval_sequences=2", "select_max_tokens=3", "select_steps=3"]))
    engine = load_engine(tmp_path / "engine")
    selection = engine.method_state["selection"]
    assert engine.manifest["method_config"]["draft_tokens"] == selection["draft_tokens"]
    assert engine.manifest["method_config"]["skip_layers"] == selection["skipped_layers"]
    assert engine.method_state["compile_time_prediction"]["speedup"] > 0
    assert engine.method_state["kept_layers"] == [i for i in range(6) if not
                                                  selection["skipped_layers"][0] <= i <= selection["skipped_layers"][1]]
    assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)
