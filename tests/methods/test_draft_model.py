"""`draft-model`'s two draft-cost levers: a draft LM head reduced to frequent tokens
(`draft_vocab_size`) and confidence-stopped drafting (`stop_threshold`). Both
leave the output the target's: token-identical to HF greedy, and the target's
exact distribution when sampling. (Plain chains and trees: the exactness matrix, tests/matrix.)"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
import torch.fx as fx
from safetensors.torch import load_file

from specc.capture.load import load_model
from specc.cli.main import main
from specc.compiler import CompileRequest, build_program, compile_engine
from specc.contract.descriptor import get_method
from specc.contract.sampling import SamplingConfig
from specc.engine.loaded import load_engine
from specc.errors import UsageError
from specc.lower.row_padding import PaddedRows
from specc.methods.draft_model import DraftModelConfig
from specc.methods.draft_model.drafter import build_runtime
from specc.passes.manager import run_passes
from specc.passes.reduce_draft_vocabulary import DraftVocabularyConfig, ReduceDraftVocabulary
from specc.runtime.context import MethodContext
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY
from specc.runtime.generate import generate
from specc.testing.checkpoints import (TINY_VOCAB, assert_matches_hf_greedy, assert_samples_the_target,
                           assert_turns_reusing_match_hf_greedy, build_tiny_checkpoint,
                           recording_drafted_tokens, recording_rounds, sample_calibration_text, varied_prompts)

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
NUM_PROMPTS = 20
DRAFT_VOCAB = TINY_VOCAB // 4
ENGINES = {   # name -> settings; `calib-*` choose the vocabulary on text the target samples
    "full": [],
    "builtin": [f"draft_vocab_size={DRAFT_VOCAB}"],
    "calib-chain": [f"draft_vocab_size={DRAFT_VOCAB}", "num_draft_tokens=3"],
    "calib-tree": [f"draft_vocab_size={DRAFT_VOCAB}", "num_draft_tokens=3", "tree_width=3"],
}


def compile_draft_model(checkpoints, output, settings: list[str]):
    target, draft = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="draft-model", output=output, max_seq_len=MAX_SEQ_LEN,
                                  settings=[*settings, f"draft_model={draft}"]))
    return load_engine(output), target


@pytest.fixture(scope="module")
def engines(checkpoints, tmp_path_factory):
    """name (of ENGINES) -> (engine, target checkpoint), each compiled once."""
    built = {}

    def get(name: str):
        if name not in built:
            root = tmp_path_factory.mktemp(f"draft-model-{name}")
            settings = list(ENGINES[name])
            if name.startswith("calib"):
                calib = sample_calibration_text(checkpoints("llama")[0], root / "calib.txt", sequences=32)
                settings.append(f"calib_data={calib}")
            built[name] = compile_draft_model(checkpoints, root / "engine", settings)
        return built[name]

    return get


def assert_identical(generate_ids, target) -> list:
    return assert_matches_hf_greedy(generate_ids, target, varied_prompts(NUM_PROMPTS, 96, seed=11), MAX_NEW_TOKENS)


def recorded_runtime(engine, **settings):
    """(target, drafter, rounds) of the engine's graphs under another runtime config."""
    return recording_rounds(build_runtime(engine.context, dataclasses.replace(engine.config, **settings)))


# --- a reduced draft vocabulary ---------------------------------------------------


@pytest.mark.parametrize("name", ["calib-chain", "calib-tree"])
def test_reduced_vocabulary_is_lossless_and_drafts_only_its_tokens(engines, one_thread, name):
    engine, target = engines(name)
    ids = engine.method_state[DRAFT_VOCABULARY_KEY]
    drafted = recording_drafted_tokens(engine.drafter)
    results = assert_identical(lambda prompt: engine.generate_ids(prompt, MAX_NEW_TOKENS), target)
    assert drafted and set(drafted) <= set(ids)
    assert sum(r.stats.accepted_tokens for r in results) > 0


@pytest.mark.shared_data
def test_a_turn_after_a_reused_prefix_matches_hf_greedy(engines, one_thread):
    """The draft model resumes from its own KV cache."""
    engine, target = engines("full")
    reused = assert_turns_reusing_match_hf_greedy(engine, target, varied_prompts(1, 96, seed=5)[0] + [7, 9, 11],
                                                  MAX_NEW_TOKENS)[-1]
    assert engine.drafter.follower.valid > reused


def test_reduced_head_has_draft_vocab_size_rows_and_is_recorded(engines):
    engine, _ = engines("builtin")
    ids = engine.method_state[DRAFT_VOCABULARY_KEY]
    assert len(ids) == DRAFT_VOCAB == len(set(ids))
    assert set(engine.architecture("draft").eos_token_ids) <= set(ids)
    assert "built-in" in engine.method_state["calibration"]
    assert 0 < engine.method_state["draft_vocabulary_heldout_coverage"] <= 1
    logits = {name: [s for s in engine.context.signatures[name].outputs if s.role == "logits"][0].shape
              for name in ("draft", "target")}
    assert logits == {"draft": (1, "r", DRAFT_VOCAB), "target": (1, "r", "vocab")}   # the full head is symbolic
    passes = [(r["graph"], r["pass_name"]) for r in engine.manifest["passes"]]
    assert ("draft", "reduce_draft_vocabulary") in passes and ("target", "reduce_draft_vocabulary") not in passes
    added = load_file(str(engine.path / "weights" / "added.safetensors"))
    draft_weights = load_file(str(engine.path / "weights" / "draft.safetensors"))
    assert list(added) == ["draft_head.weight"] and "draft_head.weight" not in draft_weights
    full_head = load_model(Path(engine.manifest["method_config"]["draft_model"])).lm_head.weight.detach()
    assert torch.equal(added["draft_head.weight"], full_head[torch.tensor(ids)])


def test_the_full_head_is_the_default(engines):
    engine, _ = engines("full")
    assert engine.manifest["method_config"]["draft_vocab_size"] == 0
    assert "reduce_draft_vocabulary" not in [r["pass_name"] for r in engine.manifest["passes"]]
    assert DRAFT_VOCABULARY_KEY not in engine.method_state
    assert not (engine.path / "weights" / "added.safetensors").exists()


# --- confidence-stopped drafting ----------------------------------------------------


def test_a_threshold_near_one_drafts_one_token_per_round(engines, one_thread):
    engine, target = engines("full")
    model, drafter, rounds = recorded_runtime(engine, stop_threshold=0.999999)
    assert_identical(lambda prompt: generate(model, drafter, prompt, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN),
                     target)
    assert rounds and all(tree.spec.depth == 1 for tree, _ in rounds)


@pytest.mark.parametrize("name", ["full", "calib-tree"])
def test_a_middling_threshold_varies_the_depth_and_stays_lossless(engines, one_thread, name):
    engine, target = engines(name)
    model, drafter, rounds = recorded_runtime(engine, stop_threshold=0.2, num_draft_tokens=4)
    assert_identical(lambda prompt: generate(model, drafter, prompt, MAX_NEW_TOKENS, SamplingConfig(), MAX_SEQ_LEN),
                     target)
    depths = {tree.spec.depth for tree, _ in rounds}
    assert 1 in depths and 4 in depths, f"the threshold never stopped early or never let a round run: {depths}"
    assert any(len(path) - 1 == tree.spec.depth for tree, path in rounds), "no round was fully accepted"


# --- sampling keeps the target distribution ----------------------------------------


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A 16-token target with no EOS, a noisy copy as its draft, and their program."""
    root = tmp_path_factory.mktemp("draft-model-vocab16")
    target = build_tiny_checkpoint("llama", root / "target", seed=3, vocab_size=16, eos_token_id=None)
    draft = build_tiny_checkpoint("llama", root / "draft", seed=4, noise_from=target, noise=0.5)
    model = load_model(target)
    program = build_program({"target": model, "draft": load_model(draft)}, get_method("draft-model"),
                            DraftModelConfig(draft_model=str(draft)), MAX_SEQ_LEN)
    return model, program


def with_reduced_draft(program, ids: tuple[int, ...]):
    """A copy of the program whose draft head keeps only `ids` (the others can never be drafted)."""
    program = copy.copy(program)
    program.graphs = dict(program.graphs)
    draft = program.graphs["draft"]
    reduced, _ = run_passes("draft", fx.GraphModule(draft.module, copy.deepcopy(draft.module.graph)),
                            [ReduceDraftVocabulary(DraftVocabularyConfig(ids))])
    program.graphs["draft"] = dataclasses.replace(draft, module=reduced)
    return program


def depth_recording(drafter):
    """Record (the budget's depth, the depth drafted) of every proposal."""
    proposals = []
    propose = drafter.propose

    def record(tokens, budget, sampling, generator):
        draft = propose(tokens, budget, sampling, generator)
        if draft is not None:
            proposals.append((budget.max_depth, draft.tree.spec.depth))
        return draft

    drafter.propose = record
    return proposals


# Each variant samples for half a minute on a 2-core CPU: a chain over the reduced vocabulary and a
# stopped tree over the full one by default, the three others with -m slow.
@pytest.mark.parametrize("variant,settings,sampling", [
    ("reduced-chain", dict(num_draft_tokens=2), SamplingConfig(temperature=1.0)),
    pytest.param("reduced-tree", dict(num_draft_tokens=2, tree_width=3), SamplingConfig(temperature=0.8, top_p=0.9),
                 marks=pytest.mark.slow),
    pytest.param("reduced-chain-stopped", dict(num_draft_tokens=2, stop_threshold=0.9),
                 SamplingConfig(temperature=1.0), marks=pytest.mark.slow),
    pytest.param("full-chain-stopped", dict(num_draft_tokens=2, stop_threshold=0.9), SamplingConfig(temperature=1.0),
                 marks=pytest.mark.slow),
    ("full-tree-stopped", dict(num_draft_tokens=2, tree_width=2, stop_threshold=0.9),
     SamplingConfig(temperature=0.8, top_p=0.9)),
])
def test_sampling_matches_the_target_distribution(small_vocab, one_thread, variant, settings, sampling):
    model, program = small_vocab
    state = {}
    if variant.startswith("reduced"):
        ids = (3, 0, 7, 9, 1, 12, 5, 15, 8, 2)
        program, state = with_reduced_draft(program, ids), {DRAFT_VOCABULARY_KEY: list(ids)}
    context = MethodContext.eager(program, MAX_SEQ_LEN, state=state)
    target, drafter, rounds = recording_rounds(build_runtime(context, DraftModelConfig(**settings)))
    proposals = depth_recording(drafter)
    # Four new tokens: the first round after the prefill may draft two deep, which a stop cuts short.
    assert_samples_the_target(model, target, drafter, rounds, sampling, MAX_SEQ_LEN, new_tokens=4)
    full_depth = [depth == min(2, budget) for budget, depth in proposals]
    assert any(budget == depth == 2 for budget, depth in proposals)
    if "stopped" in variant:
        assert not all(full_depth), "the threshold never stopped a round early"
    else:
        assert all(full_depth)


# --- configuration ----------------------------------------------------------------


def test_config_fields_are_documented(capsys):
    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    for field in ("draft_vocab_size: int = 0", "stop_threshold: float = 0.0", "calib_data"):
        assert field in listing


@pytest.mark.parametrize("bad", ["draft_vocab_size=-1", "stop_threshold=1.0", "stop_threshold=-0.1",
                                 "stop_threshold=2", "draft_vocab_size=2,tree_width=3"])
def test_bad_settings_are_usage_errors(bad):
    with pytest.raises(UsageError, match=bad.split("=")[0]):
        DraftModelConfig.from_assignments(bad.split(","))


def test_a_missing_calibration_file_fails_before_loading(checkpoints, tmp_path):
    target, draft = checkpoints("llama")
    request = CompileRequest(model=str(target), method="draft-model", output=tmp_path / "engine",
                             settings=[f"draft_model={draft}", "draft_vocab_size=8", "calib_data=no/such.txt"])
    with pytest.raises(UsageError, match="calib_data"):
        compile_engine(request)


def test_a_q4_engine_packs_the_reduced_draft_head_and_matches_q4_none(checkpoints, tmp_path, one_thread):
    """The reduced head is a frozen copy of the draft's rows: `--quantize` packs it, and the
    engine stays token-identical to the `none` engine with the same weights."""
    target, draft = checkpoints("llama")
    common = dict(model=str(target), max_seq_len=MAX_SEQ_LEN, dtype="bfloat16", quantize="q4")
    compile_engine(CompileRequest(method="none", output=tmp_path / "none", **common))
    compile_engine(CompileRequest(method="draft-model", output=tmp_path / "draft",
                                  settings=[f"draft_vocab_size={DRAFT_VOCAB}", f"draft_model={draft}"], **common))
    none, engine = load_engine(tmp_path / "none"), load_engine(tmp_path / "draft")
    draft_graph = engine.context.graphs["draft"]
    assert not [n for n in draft_graph.graph.nodes if n.target == torch.ops.aten.linear.default]
    prompts = varied_prompts(6, 96, seed=3)
    results = [engine.generate_ids(p, MAX_NEW_TOKENS) for p in prompts]
    assert [r.token_ids for r in results] == [none.generate_ids(p, MAX_NEW_TOKENS).token_ids for p in prompts]
    assert sum(r.stats.accepted_tokens for r in results) > 0


def test_a_q4_draft_beside_a_bfloat16_target_matches_bfloat16_none(checkpoints, tmp_path, one_thread):
    """`--quantize-draft` packs the draft model only: the target stays bfloat16 and verifies every
    token, so the engine is token-identical to the bfloat16 `none` engine; the manifest reports
    the draft's quantization under its own key."""
    target, draft = checkpoints("llama")
    common = dict(model=str(target), max_seq_len=MAX_SEQ_LEN, dtype="bfloat16")
    compile_engine(CompileRequest(method="none", output=tmp_path / "none", **common))
    report = compile_engine(CompileRequest(method="draft-model", output=tmp_path / "draft", quantize_draft="q4",
                                           settings=[f"draft_model={draft}"], **common))
    assert "quantization" not in report and report["draft_quantization"]["scheme"] == "q4"
    assert report["draft_quantization"]["bytes"]["quantized"] < 0.5 * report["draft_quantization"]["bytes"]["unquantized"]
    none, engine = load_engine(tmp_path / "none"), load_engine(tmp_path / "draft")
    graphs = engine.context.graphs
    assert isinstance(graphs["target"], PaddedRows)   # bfloat16: the target's short calls run padded ...
    assert [n for n in graphs["target"].forward.graph.nodes if n.target == torch.ops.aten.linear.default]
    assert not [n for n in graphs["draft"].graph.nodes if n.target == torch.ops.aten.linear.default]   # ... q4's as called
    prompts = varied_prompts(6, 96, seed=5)
    results = [engine.generate_ids(p, MAX_NEW_TOKENS) for p in prompts]
    assert [r.token_ids for r in results] == [none.generate_ids(p, MAX_NEW_TOKENS).token_ids for p in prompts]
    assert sum(r.stats.accepted_tokens for r in results) > 0
