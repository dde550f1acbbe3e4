"""FIRP: token-identical to HF greedy on every tree and pseudo-row choice, pseudo K/V that never
reaches the committed cache, training that computes what inference computes and lowers the
loss, the engine round trip. Greedy exactness on every family and backend, sampling and seed
determinism: the conformance suite (tests/matrix)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specc.capture.load import load_model, load_tokenizer
from specc.compiler import CompileRequest, build_program, compile_engine, training_context
from specc.contract.descriptor import get_method
from specc.engine.loaded import load_engine
from specc.errors import SpeccError, UsageError
from specc.methods.firp import FIRPConfig
from specc.methods.firp.config import sized_tree, tree_widths
from specc.methods.firp.runtime import PseudoRows
from specc.methods.firp.train import (PseudoStudent, WindowTeacher, deep_cuts, projection_parameters, teacher_graph,
                                      train_projections)
from specc.contract.drafter import DraftBudget
from specc.contract.sampling import SamplingConfig
from specc.runtime.cached_model import chunk_layout
from specc.runtime.context import MethodContext
from specc.runtime.generate import generate
from specc.testing.checkpoints import (FAMILIES, assert_matches_hf_greedy,
                                       assert_turns_reusing_match_hf_greedy, hf_greedy,
                                       recording_rounds, sample_calibration_text, trained_engines, varied_prompts)

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
TRAIN = ["train_steps=10", "train_seq_len=32", "train_windows=8", "eval_sequences=2", "eval_every=10",
         "learning_rate=1e-2"]
METHOD = get_method("firp")


@pytest.fixture(scope="module")
def engines(checkpoints, tmp_path_factory):
    """(family, backend) -> (engine trained for a few steps, target checkpoint)."""
    return trained_engines("firp", checkpoints, tmp_path_factory, TRAIN, MAX_SEQ_LEN, temperature=0.5)


def assert_identical(generate_ids, target: Path) -> list:
    return assert_matches_hf_greedy(generate_ids, target, varied_prompts(20, 96, seed=11), MAX_NEW_TOKENS)


def runtime(context: MethodContext, config: FIRPConfig):
    """(target, drafter, rounds): `rounds` records (tree, accepted path) of every speculative round."""
    built = METHOD.build_runtime(context, config)
    return recording_rounds(built)


def nudge(program, scale: float, seed: int = 0) -> None:
    """Move the projections off identity/zero (drafts that are sometimes right, sometimes wrong)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in projection_parameters(program.graphs["target"].module).values():
            p.add_(torch.randn(p.shape, generator=generator) * scale)


# --- losslessness ------------------------------------------------------------


def test_a_round_drafts_at_most_the_default_trees_five_nodes(engines):
    """The default tree (`cpu`, widths 2, 2, 1) bounds every round's draft (the engine's greedy
    exactness on every family and backend is the conformance suite's, tests/matrix)."""
    engine, _ = engines("llama")
    results = [engine.generate_ids(ids, MAX_NEW_TOKENS) for ids in varied_prompts(20, 96, seed=11)]
    assert max(r.stats.drafted_tokens / max(1, r.stats.target_forward_passes - 1) for r in results) <= 5


def test_a_turn_after_a_reused_prefix_matches_hf_greedy(engines):
    """The prefill of a turn's new tokens carries the last prompt token's pseudo rows, past the
    reused prefix; the drafter keeps nothing older."""
    engine, target = engines("llama")
    reused = assert_turns_reusing_match_hf_greedy(engine, target, varied_prompts(1, 96, seed=5)[0] + [7, 9, 11],
                                                  MAX_NEW_TOKENS)
    assert reused[0] == 0 and reused[-1] > reused[1] > 0


@pytest.fixture(scope="module")
def llama_program(checkpoints):
    """An in-memory llama FIRP program with nudged projections, and its target checkpoint."""
    target = checkpoints("llama")[0]
    program = build_program({"target": load_model(target)}, METHOD, FIRPConfig(), MAX_SEQ_LEN)
    nudge(program, 0.05)
    return program, target


@pytest.mark.parametrize("tree,pseudo_rows", [("chain", "chain"), ("16", "all"), ("63", "chain"), ("3,1,2", "all")])
def test_trees_and_pseudo_row_choices_match_hf_greedy(llama_program, tree, pseudo_rows):
    program, target = llama_program
    config = FIRPConfig(tree=tree, pseudo_rows=pseudo_rows)
    model, drafter, rounds = runtime(MethodContext.eager(program, MAX_SEQ_LEN), config)
    assert_identical(lambda ids: generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN), target)
    assert rounds and any(len(path) > 1 for _, path in rounds), "nothing was ever accepted"
    assert max(tree.spec.depth for tree, _ in rounds) == 3
    if tree in ("16", "63"):
        assert any(node not in t.chain_nodes for t, path in rounds for node in path[1:]), \
            "no sibling was ever accepted; the tree lost coverage"


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_aoti_matches_hf_greedy(engines, family):
    engine, target = engines(family, "aoti")
    assert sorted(p.name for p in (engine.path / "compiled").iterdir()) == ["target.pt2", "target.wide.pt2"]
    results = assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)
    assert sum(r.stats.accepted_tokens for r in results) > 0


@pytest.mark.slow
def test_kernels_match_hf_greedy(checkpoints, tmp_path):
    """Attention through specc's tree-attention op (`--kernels`) reads the same extended mask."""
    target = checkpoints("llama")[0]
    compile_engine(CompileRequest(model=str(target), method="firp", output=tmp_path / "engine",
                                  max_seq_len=MAX_SEQ_LEN, kernels=True, settings=["train_steps=0"]))
    engine = load_engine(tmp_path / "engine")
    assert engine.manifest["kernels"] == {"target": ["tree_attention"]}
    assert_identical(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target)


def test_near_the_length_limit_forwards_run_without_pseudo_rows(llama_program):
    program, target = llama_program
    model, drafter, rounds = runtime(MethodContext.eager(program, 40), FIRPConfig(pseudo_rows="all"))
    prompt = varied_prompts(8, 96, seed=3)[7]   # 34 tokens: a tree's 6 nodes and 18 pseudo rows do not fit in 40
    assert len(prompt) == 34
    result = generate(model, drafter, prompt, 6, SamplingConfig(), 40)
    assert result.token_ids == hf_greedy(target, [prompt], 6)[0]


# --- pseudo K/V is never committed ----------------------------------------------


def test_committed_cache_is_what_the_plain_target_writes(llama_program):
    """After a FIRP generation, every committed row equals the K/V of one plain causal forward
    of the same tokens (no pseudo rows), though pseudo rows wrote scratch slots all along."""
    program, _ = llama_program
    model, drafter, rounds = runtime(MethodContext.eager(program, MAX_SEQ_LEN), FIRPConfig(tree="16",
                                                                                           pseudo_rows="all"))
    prompt = varied_prompts(4, 96, seed=2)[3]
    result = generate(model, drafter, prompt, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN)
    assert rounds and any(len(path) > 1 for _, path in rounds)
    committed = len(prompt) + len(result.token_ids) - 1
    plain, _, _ = runtime(MethodContext.eager(program, MAX_SEQ_LEN), FIRPConfig())
    with torch.inference_mode():
        plain.model.run(torch.tensor(prompt + result.token_ids[:-1]),
                        *chunk_layout(0, committed, "cpu"), torch.arange(committed)[None],
                        torch.zeros(1, committed, dtype=torch.long))
    for got, want in zip(model.cache.tensors, plain.cache.tensors):
        torch.testing.assert_close(got[:, :, :committed], want[:, :, :committed], rtol=1e-5, atol=1e-5)
    assert any((got[:, :, committed:] != 0).any() for got in model.cache.tensors), "no scratch was ever written"


def test_poisoned_scratch_changes_nothing(llama_program):
    """Overwrite every slot past the real rows after each forward: the output stays HF greedy."""
    program, target = llama_program
    model, drafter, _ = runtime(MethodContext.eager(program, MAX_SEQ_LEN), FIRPConfig(tree="cpu"))
    run = model.model.run

    def poisoning(tokens, positions, slots, mask, *extra):
        verification = run(tokens, positions, slots, mask, *extra)
        real = int((extra[1][0] == 0).sum())
        for cache in model.cache.tensors:
            cache[:, :, int(slots[real - 1]) + 1:] = 1e4
        return verification

    model.model.run = poisoning
    assert_identical(lambda ids: generate(model, drafter, ids, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN),
                     target)


def test_verification_returns_tree_rows_and_pseudo_logits_per_anchor(llama_program):
    program, _ = llama_program
    model, drafter, _ = runtime(MethodContext.eager(program, MAX_SEQ_LEN), FIRPConfig(tree="cpu"))
    with torch.inference_mode():
        prefill = model.prefill(torch.tensor([5, 9, 7, 11]), 0)
        assert prefill.logits.shape == (4, 96)
        assert isinstance(prefill.carries, PseudoRows)
        assert prefill.carries.logits.shape == (1, 3, 96)
        assert prefill.carries.nodes == (3,)
        drafter.begin(torch.tensor([5, 9, 7, 11]), prefill)
        draft = drafter.propose([5, 9, 7, 11, 13], DraftBudget(20, 80), SamplingConfig(), None)
        assert draft.tree.spec.widths == (2, 2, 1)
        assert draft.node_tokens[1:3].tolist() == prefill.carries.logits[0, 0].topk(2).indices.tolist()
        verification = model.verify_tree(draft, 4)
    assert verification.logits.shape == (6, 96)
    assert verification.carries.nodes == (0, 1, 3, 5)   # the root and the chain
    assert verification.carries.logits.shape == (4, 3, 96)


# --- the engine and its config ----------------------------------------------------


def test_engine_stores_the_projections_with_its_report(engines):
    engine, _ = engines("llama")
    assert set(engine.manifest["graphs"]) == {"target"}
    source = load_file(str(engine.path / "weights" / "target.safetensors"))
    added = load_file(str(engine.path / "weights" / "added.safetensors"))
    assert sorted(added) == [f"firp_proj.{i}.{kind}" for i in (1, 2, 3) for kind in ("bias", "weight")]
    assert not any(name.startswith("firp_") for name in source)
    assert not torch.equal(added["firp_proj.1.weight"], torch.eye(64)), "training should move W_1"
    state = engine.method_state
    assert state["pseudo_layers"] == [1, 2, 2] and state["steps"] == 3 and state["tree_widths"] == [2, 2, 1]
    agreement = state["heldout_agreement_by_step"]
    assert len(agreement["before"]) == len(agreement["after"]) == 3
    assert [r["steps"] for r in state["training"]] == [10, 10, 10] and state["train_seconds"] > 0
    record = [r for r in engine.manifest["passes"] if r["graph"] == "target"][-2]
    assert record["pass_name"] == "insert_pseudo_hidden_projections"
    assert record["added_inputs"] == ["pseudo_source", "pseudo_step"]
    assert len(record["added_parameters"]) == 6


def test_bfloat16_engines_are_lossless_with_one_pseudo_step_only(checkpoints, tmp_path, caplog):
    """k pseudo rows per node widen every verification: bfloat16 computes 4 rows exactly
    (`Backend.exact_rows`), which with k = 3 leaves no room for a drafted token, so that engine
    promises no identity with `none` (uncapped); with k = 1 a drafted token and both nodes'
    pseudo rows fit, so it stays lossless, drafts one token a round, and its prefill and every
    call stay within the 4 rows (identity itself: the exactness matrix's firp:k1 cells)."""
    target = checkpoints("llama")[0]
    for dtype, steps in (("float32", 3), ("bfloat16", 3), ("bfloat16", 1)):
        compile_engine(CompileRequest(model=str(target), method="firp", output=tmp_path / f"{dtype}-{steps}",
                                      dtype=dtype, max_seq_len=MAX_SEQ_LEN, settings=["train_steps=0", f"steps={steps}"]))
    assert load_engine(tmp_path / "float32-3").manifest["lossless"] is True
    lossy = load_engine(tmp_path / "bfloat16-3")
    assert lossy.manifest["lossless"] is False and lossy.max_draft_rows is None
    assert "marked lossy" in caplog.text and "4 rows per draft node" in caplog.text
    engine = load_engine(tmp_path / "bfloat16-1")
    assert engine.manifest["lossless"] is True and engine.max_draft_rows == 2
    calls = []
    run = engine.target.model.run
    engine.target.model.run = lambda tokens, *args: calls.append(tokens.numel()) or run(tokens, *args)
    steps = []
    for prompt in varied_prompts(8, 64, seed=3)[4:]:
        calls.clear()
        engine.generate_ids(prompt, MAX_NEW_TOKENS)
        assert calls[0] == len(prompt), "a prompt's prefill carries no pseudo rows"
        steps += calls[1:]
    assert max(steps) == 4, steps   # a drafted token, its root and one pseudo row each


def test_config_is_validated_naming_the_setting(checkpoints, tmp_path):
    for bad in ("steps=0", "layers=2,1", "tree=5", "tree=2,2", "tree=0,1,1", "pseudo_rows=some",
                "train_seq_len=4"):
        with pytest.raises(UsageError, match=bad.split("=")[0]):
            FIRPConfig.from_assignments([bad])
    assert tree_widths("16", 3) == (7, 5, 3) and tree_widths("32", 3) == (14, 10, 7)
    assert tree_widths("63", 3) == (28, 20, 14) and tree_widths("cpu", 2) == (2, 2)
    assert sum(sized_tree(16, 4)) == 15 and FIRPConfig(layers=(1, 2)).widths() == (2, 2)
    request = CompileRequest(model=str(checkpoints("llama")[0]), method="firp", output=tmp_path / "engine",
                             settings=["layers=1,3", "train_steps=0"])
    with pytest.raises(SpeccError, match="layers=1,3"):
        compile_engine(request)


# --- compile-time training --------------------------------------------------------


@pytest.fixture(scope="module")
def trainable(checkpoints, tmp_path_factory):
    """A llama FIRP program, its initial projections, tokenizer, calibration text."""
    target = checkpoints("llama")[0]
    calib = sample_calibration_text(target, tmp_path_factory.mktemp("calib") / "calib.txt", sequences=128,
                                    temperature=0.5)
    context = training_context({"target": load_model(target)}, METHOD, FIRPConfig(), MAX_SEQ_LEN)
    initial = {k: v.detach().clone() for k, v in projection_parameters(context.program.graphs["target"].module).items()}
    return context, initial, load_tokenizer(target), calib


def train_from_initial(trainable, *settings: str):
    context, initial, tokenizer, calib = trainable
    with torch.no_grad():
        for name, p in projection_parameters(context.program.graphs["target"].module).items():
            p.copy_(initial[name])
    config = FIRPConfig.from_assignments([f"calib_data={calib}", "train_seq_len=48", "eval_sequences=4",
                                          *settings])
    return train_projections(context, config, tokenizer)


def test_training_lowers_the_loss_of_every_step(trainable):
    result = train_from_initial(trainable, "train_steps=120", "learning_rate=1e-2", "eval_every=120")
    for report in result.state["training"]:
        assert report["heldout"][-1]["loss"] < report["heldout"][0]["loss"] - 0.1
        assert report["train_loss_last"] < report["train_loss_first"]
    assert result.state["teacher_seconds"] > 0


def test_the_student_computes_what_inference_computes(llama_program):
    """Step i's training rows (deep cut, teacher K/V, earlier steps' stored pseudo K/V) give
    the logits the runtime's pseudo rows give for the same anchor."""
    program, checkpoint = llama_program
    target_graph = program.graphs["target"].module
    arch = program.graphs["target"].architecture
    layers = FIRPConfig().pass_config().resolve(arch.num_layers)
    window = torch.tensor(varied_prompts(8, 96, seed=4)[6][:12])
    def build(recipes):
        return build_program({"target": load_model(checkpoint)}, METHOD, FIRPConfig(), MAX_SEQ_LEN, recipes=recipes)
    stored = WindowTeacher(teacher_graph(build, target_graph, layers), arch, layers, 8)(window)
    parameters = projection_parameters(target_graph)
    cuts = deep_cuts(build, target_graph, layers)
    students = [PseudoStudent(cuts[t], t, i, parameters[f"firp_proj.{i}.weight"], parameters[f"firp_proj.{i}.bias"])
                for i, t in enumerate(layers, start=1)]
    trained = []
    with torch.no_grad():
        for student in students:
            trained.append(student(stored))
            student.keep_pseudo_kv(stored)
    model, _, _ = runtime(MethodContext.eager(program, MAX_SEQ_LEN), FIRPConfig())
    anchor = 6
    with torch.inference_mode():
        pseudo = model.prefill(window[: anchor + 1], 0).carries.logits[0]
    for i, logits in enumerate(trained, start=1):
        torch.testing.assert_close(logits[anchor], pseudo[i - 1], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_training_raises_the_agreement_of_every_step_on_a_trained_model():
    """Random tiny models have no predictable future (training lowers the loss by hedging, and
    top-1 agreement is noise), so agreement is checked on the `tiny` reference model, trained
    on real text (cached after its first build, about a minute on two cores)."""
    from specc.refmodels import build_reference_model

    checkpoint = build_reference_model("tiny", progress=False)
    context = training_context({"target": load_model(checkpoint)}, METHOD, FIRPConfig(), MAX_SEQ_LEN)
    config = FIRPConfig.from_assignments(["train_steps=200", "train_seq_len=64", "learning_rate=3e-3",
                                          "eval_every=200", "eval_sequences=8"])
    result = train_projections(context, config, load_tokenizer(checkpoint))
    agreement = result.state["heldout_agreement_by_step"]
    assert all(after > before + 0.03 for before, after in zip(agreement["before"], agreement["after"])), agreement


def test_the_teacher_graph_returns_the_states_entering_the_pseudo_layers(llama_program):
    """`expose_layer_inputs` appends, per layer t, the state a shallow cut at t returns, keeps
    the target's outputs before them, declares the new ones, and changes nothing when run again."""
    from specc.contract.descriptor import TARGET, GraphRecipe
    from specc.graph.signature import read_signature
    from specc.methods.firp import target_passes
    from specc.passes.expose_layer_inputs import LAYER_INPUT_ROLE, ExposeLayerInputs, LayerInputsConfig
    from specc.methods.firp.insert_pseudo_hidden_projections import PSEUDO_SOURCE_ROLE, PSEUDO_STEP_ROLE
    from specc.methods.firp.train import graph_inputs
    from specc.passes.expose_layer_exit import ExposeLayerExit, LayerExitConfig
    from specc.train.inputs import decoding_inputs

    program, checkpoint = llama_program
    target, arch = program.graphs["target"].module, program.graphs["target"].architecture
    layers = (1, 2)

    def build(recipes):
        return build_program({"target": load_model(checkpoint)}, METHOD, FIRPConfig(), MAX_SEQ_LEN, recipes=recipes)
    teacher = teacher_graph(build, target, layers)
    roles = [spec.role for spec in read_signature(teacher).outputs]
    assert roles == [spec.role for spec in read_signature(target).outputs] + [LAYER_INPUT_ROLE] * len(layers)
    assert not ExposeLayerInputs(LayerInputsConfig(layers))(teacher).modified

    cuts = build({f"shallow-{t}": GraphRecipe(TARGET, lambda c, t=t: [*target_passes(c), ExposeLayerExit(
        LayerExitConfig(t, "shallow"))]) for t in layers})
    window = torch.tensor(varied_prompts(1, 96, seed=12)[0][:9])
    tokens, positions, mask, slots = decoding_inputs(window, arch.sliding_window)
    rows = torch.arange(window.numel())[None]
    values = {"tokens": tokens, "positions": positions, "attention_mask": mask, "cache_slots": slots,
              PSEUDO_SOURCE_ROLE: rows, PSEUDO_STEP_ROLE: torch.zeros_like(rows)}

    def run(gm):
        caches = [torch.zeros(1, arch.num_key_value_heads, window.numel() + 1, arch.head_dim)
                  for _ in range(2 * arch.num_layers)]
        with torch.no_grad():
            return gm(*graph_inputs(gm, values, caches))
    logits, *states = run(teacher)
    torch.testing.assert_close(logits, run(target)[0], rtol=0, atol=0)
    for t, state in zip(layers, states):
        torch.testing.assert_close(state, run(cuts.graphs[f"shallow-{t}"].module)[0], rtol=0, atol=0)
