"""Method `swift`: lossless against Hugging Face greedy on every family, in
eager and Inductor (two families by default, every one with -m slow); skip sets change at run time without recompiling;
tree sampling keeps the target distribution; calibration stores the skip set."""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM

from specc.compiler import CompileRequest, compile_engine
from specc.contract.drafter import DraftBudget
from specc.contract.sampling import SamplingConfig
from specc.engine.inspect_engine import inspect_engine
from specc.engine.loaded import load_engine
from specc.errors import UsageError
from specc.methods.swift import SKIP_SET_KEY, SwiftConfig
from specc.methods.swift.drafter import SearchLimit
from specc.runtime.acceptance import accept_sampled_tree
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY
from specc.runtime.sampling import probabilities
from specc.testing.checkpoints import (FAMILIES, assert_matches_hf_greedy,
                           build_tiny_checkpoint, hf_greedy,
                           set_eos_to_a_generated_token, varied_prompts)

LAYERS = 4
MAX_NEW_TOKENS = 24
NUM_PROMPTS = 20
# A short scoring window so the layer-set search runs within 24 new tokens.
RUN_SETTINGS = ["calib_prompts=0", "adapt=true", "context_window=8", "max_tries_per_prompt=8"]
DRAFT_VOCAB = 48   # of the tiny models' 96 tokens: the draft graph's reduced head


@pytest.fixture(scope="module")
def swift_checkpoint(tmp_path_factory):
    """family -> a seeded 4-layer checkpoint where some greedy generations hit EOS."""
    cache = {}

    def get(family: str):
        if family not in cache:
            path = build_tiny_checkpoint(family, tmp_path_factory.mktemp(family) / "target", num_hidden_layers=LAYERS)
            set_eos_to_a_generated_token(path, varied_prompts(12, 96, seed=7), MAX_NEW_TOKENS)
            cache[family] = path
        return cache[family]

    return get


def compile_swift(checkpoint, output, backend="eager", settings=RUN_SETTINGS, max_seq_len=96):
    compile_engine(CompileRequest(model=str(checkpoint), method="swift", output=output, backend=backend,
                                  max_seq_len=max_seq_len, settings=list(settings)))
    return load_engine(output)


def assert_identical(engine, checkpoint, prompts):
    return assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), checkpoint, prompts,
                                    MAX_NEW_TOKENS)


@pytest.mark.parametrize("family", FAMILIES)
def test_eager_matches_hf_greedy(swift_checkpoint, tmp_path, family):
    checkpoint = swift_checkpoint(family)
    engine = compile_swift(checkpoint, tmp_path / "engine")
    results = assert_identical(engine, checkpoint, varied_prompts(NUM_PROMPTS, 96, seed=11))
    assert sum(r.stats.accepted_tokens for r in results) > 0
    assert sum(r.stats.target_forward_passes for r in results) < sum(r.stats.new_tokens for r in results)
    assert engine.drafter.search.state.tries > 0, "the layer-set search never ran"
    steps, nodes = (sum(getattr(r.stats, k) for r in results) for k in ("draft_steps", "drafted_tokens"))
    assert 0 < steps <= nodes, "α per draft step counts each tree depth once"


# llama: the skip-set test below; one family in the fast selection (each compiles for minutes on a
# 2-core CPU, and the exactness matrix runs every family in eager), the others with -m slow.
FAST_INDUCTOR_FAMILY = "qwen2"


@pytest.mark.parametrize("family", [f if f == FAST_INDUCTOR_FAMILY else pytest.param(f, marks=pytest.mark.slow)
                                    for f in FAMILIES if f != "llama"])
def test_inductor_matches_hf_greedy_while_searching(swift_checkpoint, tmp_path, family):
    checkpoint = swift_checkpoint(family)
    engine = compile_swift(checkpoint, tmp_path / "engine", backend="inductor",
                           settings=[*RUN_SETTINGS, "compile_segments=true"])
    results = assert_identical(engine, checkpoint, varied_prompts(NUM_PROMPTS, 96, seed=11))
    assert sum(r.stats.accepted_tokens for r in results) > 0
    assert engine.drafter.search.state.tries > 0, "the layer-set search never ran"


@pytest.mark.slow
def test_aoti_verification_with_eager_segments_matches_hf_greedy(swift_checkpoint, tmp_path):
    checkpoint = swift_checkpoint("llama")
    engine = compile_swift(checkpoint, tmp_path / "engine", backend="aoti")
    assert {p.name for p in (engine.path / "compiled").iterdir()} >= {"target.pt2", "draft.pt2"}
    results = assert_identical(engine, checkpoint, varied_prompts(NUM_PROMPTS, 96, seed=11))
    assert sum(r.stats.accepted_tokens for r in results) > 0


def test_inductor_matches_hf_greedy_and_skip_sets_do_not_recompile(swift_checkpoint, tmp_path):
    from torch._dynamo.utils import counters

    checkpoint = swift_checkpoint("llama")
    engine = compile_swift(checkpoint, tmp_path / "engine", backend="inductor",
                           settings=["calib_prompts=0", "adapt=false", "compile_segments=true"])
    prompts = varied_prompts(8, 96, seed=11)
    assert_identical(engine, checkpoint, prompts[:4])
    graphs = counters["stats"]["unique_graphs"]
    segments = dict(engine.drafter.draft.forward_fn.segments)
    for skip in ({"attn_2"}, {"mlp_1", "attn_2", "mlp_2"}):
        engine.drafter.use_skip_set(frozenset(skip))
        assert_identical(engine, checkpoint, prompts[4:])
    assert engine.drafter.draft.forward_fn.segments == segments
    assert counters["stats"]["unique_graphs"] == graphs, "changing the skip set must not recompile"


@pytest.mark.shared_data
def test_draft_graph_runs_the_stored_set_and_segments_run_any_other(swift_checkpoint, tmp_path):
    checkpoint = swift_checkpoint("llama")
    engine = compile_swift(checkpoint, tmp_path / "engine",
                           settings=["calib_prompts=0", "adapt=false", f"draft_vocab_size={DRAFT_VOCAB}"])
    manifest = json.loads((engine.path / "manifest.json").read_text())
    cut = [r for r in manifest["passes"] if r["pass_name"] == "skip_sublayers"]
    assert [(r["graph"], r["config"]["skip"]) for r in cut] == [("draft", ["attn_1", "mlp_1"])], "odd layers"
    reduced = [r for r in manifest["passes"] if r["pass_name"] == "reduce_draft_vocabulary"]
    assert [(r["graph"], r["config"]["size"]) for r in reduced] == [("draft", DRAFT_VOCAB)]
    assert len(engine.method_state[DRAFT_VOCABULARY_KEY]) == DRAFT_VOCAB
    compiled, segments = engine.drafter.compiled.model, engine.drafter.draft
    prompts = varied_prompts(8, 96, seed=11)
    results = assert_identical(engine, checkpoint, prompts[:4])
    assert compiled.forward_passes == sum(r.stats.draft_steps for r in results) > 0
    assert segments.forward_passes == 0
    engine.drafter.use_skip_set(frozenset({"attn_2"}))
    before = compiled.forward_passes
    results = assert_identical(engine, checkpoint, prompts[4:])
    assert segments.forward_passes == sum(r.stats.draft_steps for r in results) > 0
    assert compiled.forward_passes == before, "another skip set drafts with the segments"


def test_draft_graph_false_compiles_the_target_alone(swift_checkpoint, tmp_path):
    checkpoint = swift_checkpoint("llama")
    engine = compile_swift(checkpoint, tmp_path / "engine", settings=["calib_prompts=0", "draft_graph=false"])
    assert engine.drafter.compiled is None
    assert not any(r["pass_name"] == "skip_sublayers"
                   for r in json.loads((engine.path / "manifest.json").read_text())["passes"])


def test_skip_set_change_reuses_segments_and_stays_lossless(swift_checkpoint, tmp_path):
    checkpoint = swift_checkpoint("qwen2")
    engine = compile_swift(checkpoint, tmp_path / "engine", settings=["calib_prompts=0", "adapt=false"])
    assert engine.method_state[SKIP_SET_KEY] == ["attn_1", "mlp_1"], "uncalibrated engines store the odd layers"
    assert engine.drafter.skip_set == {"attn_1", "mlp_1"}
    forward = engine.drafter.draft.forward_fn
    segments = dict(forward.segments)
    prompts = varied_prompts(6, 96, seed=5)
    for skip in (frozenset(), frozenset({"attn_1"}), frozenset(forward.skippable)):
        engine.drafter.use_skip_set(skip)
        expected = hf_greedy(checkpoint, prompts, MAX_NEW_TOKENS)
        assert [engine.generate_ids(ids, MAX_NEW_TOKENS).token_ids for ids in prompts] == expected
    assert forward.segments == segments and all(forward.segments[k] is v for k, v in segments.items())
    with pytest.raises(UsageError, match="skippable sublayers"):
        engine.drafter.use_skip_set(frozenset({"attn_0"}))


def test_a_search_limit_bounds_the_search_and_hears_every_step(swift_checkpoint, tmp_path):
    """How compile-time calibration bounds its search: no step once the limit says no, and
    drafting goes on losslessly with the incumbent."""
    checkpoint = swift_checkpoint("llama")
    engine = compile_swift(checkpoint, tmp_path / "engine")
    steps, prompts = [], varied_prompts(4, 96, seed=13)
    engine.drafter.limit_search(SearchLimit(allows=lambda: len(steps) < 3, after_step=lambda: steps.append(1)))
    assert_identical(engine, checkpoint, prompts)
    assert len(steps) == 3
    tries = engine.drafter.search.state.tries
    assert_identical(engine, checkpoint, prompts)
    assert engine.drafter.search.state.tries == tries and len(steps) == 3


def test_skipping_a_sublayer_bypasses_it_and_writes_no_kv(swift_checkpoint, tmp_path):
    """Skipping attn_1 / mlp_2 equals the full model with that sublayer's
    output projection zeroed; a skipped attention leaves its cache untouched."""
    checkpoint = swift_checkpoint("llama")
    engine = compile_swift(checkpoint, tmp_path / "engine", settings=["calib_prompts=0", "adapt=false"])
    ids = torch.tensor(varied_prompts(1, 96, seed=3)[0] * 3)[:9]
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    for skip, weight in (("attn_1", model.model.layers[1].self_attn.o_proj.weight),
                         ("mlp_2", model.model.layers[2].mlp.down_proj.weight)):
        engine.drafter.draft.cache.tensors[2].zero_()
        with torch.inference_mode():
            slots = torch.arange(ids.numel())
            mask = (slots[None, :] <= slots[:, None])[None, None]
            logits = engine.drafter.draft.run_all(ids, slots, slots, mask, frozenset({skip}))[0][0]
            saved = weight.clone()
            weight.zero_()
            expected = model(ids[None]).logits[0]
            weight.copy_(saved)
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
        layer_1_keys = engine.drafter.draft.cache.tensors[2]
        assert (layer_1_keys.abs().sum() == 0) == (skip == "attn_1")


def test_tree_sampling_keeps_the_target_distribution(tmp_path):
    """Chi-square of the first two emitted tokens of one SWIFT round (siblings
    at every depth, point-mass rejection) against the exact target joint."""
    vocab = 16
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "ckpt", num_hidden_layers=LAYERS, vocab_size=vocab)
    engine = compile_swift(checkpoint, tmp_path / "engine", max_seq_len=32, settings=[
        "calib_prompts=0", "adapt=false", "confidence_threshold=0", "max_draft_tokens=3", "tree_widths=3,3,3,3"])
    sampling = SamplingConfig(temperature=1.0)
    prompt, root = [5, 9, 4, 12], 7
    target, drafter = engine.target, engine.drafter
    with torch.inference_mode():
        prefill = target.prefill(torch.tensor(prompt), 0)
        drafter.begin(torch.tensor(prompt), prefill)
        draft = drafter.propose(prompt + [root], DraftBudget(max_depth=3, max_nodes=32), sampling, None)
        target_probs = probabilities(target.verify_tree(draft, len(prompt)).logits, sampling)
        model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        context = torch.tensor([prompt + [root]])
        first = torch.softmax(model(context).logits[0, -1], -1)
        second = torch.stack([torch.softmax(model(torch.cat([context, torch.tensor([[a]])], 1)).logits[0, -1], -1)
                              for a in range(vocab)])
    assert draft.tree.spec.widths == (3, 3, 3)
    exact = (first[:, None] * second).flatten().double()

    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab * vocab, dtype=torch.float64)
    same_round = 0
    trials = 20000
    for _ in range(trials):
        acceptance = accept_sampled_tree(draft.node_tokens, target_probs, draft.tree, generator)
        emitted = draft.node_tokens[acceptance.path[1:]].tolist() + [acceptance.next_token]
        if len(emitted) >= 2:
            same_round += 1
        else:  # the next round would sample the second token from the target
            emitted.append(int(torch.multinomial(second[emitted[0]], 1, generator=generator)))
        counts[emitted[0] * vocab + emitted[1]] += 1
    assert same_round > trials // 10, "too few rounds accepted a drafted token for the test to mean much"
    expected = exact * trials
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    expected *= observed.sum() / expected.sum()
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


def test_compile_calibrates_and_stores_the_skip_set(swift_checkpoint, tmp_path):
    checkpoint = swift_checkpoint("llama")
    data = tmp_path / "calib.jsonl"
    data.write_text("\n".join(json.dumps({"text": " ".join(f"w{t}" for t in ids)})
                              for ids in varied_prompts(3, 96, seed=21)) + "\n")
    engine = compile_swift(checkpoint, tmp_path / "engine", settings=[
        f"calib_data={data}", "calib_prompts=3", "calib_max_new_tokens=16", "context_window=8",
        "max_tries_per_prompt=6", "adapt=false"])
    state = engine.method_state
    assert state["swift_calibration"]["tries"] > 0
    assert engine.drafter.skip_set == frozenset(state[SKIP_SET_KEY])
    summary = inspect_engine(tmp_path / "engine")
    assert f"swift_skipped_layers: {state['swift_skipped_layers']}" in summary


def test_config_rejects_bad_values():
    with pytest.raises(UsageError, match="tree_widths"):
        SwiftConfig.from_assignments(["tree_widths=1,3"])
    with pytest.raises(UsageError, match="descending"):
        SwiftConfig.from_assignments(["tree_band_percent=50,80,95"])
    with pytest.raises(UsageError, match="skip_ratio"):
        SwiftConfig.from_assignments(["skip_ratio=1.5"])
    with pytest.raises(UsageError, match="compile_segments"):
        SwiftConfig.from_assignments(["compile_segments=inductor"])
    config = SwiftConfig()
    assert [config.fan_width(p) for p in (0.99, 0.9, 0.6, 0.2)] == [1, 3, 5, 10]



@pytest.mark.parametrize("backend", ["eager", pytest.param("aoti", marks=pytest.mark.slow)])
def test_verification_runs_the_none_engines_graph_and_segments_stay_eager(swift_checkpoint, tmp_path, backend):
    """SWIFT verifies with the plain target graph (the one `none` lowers, so a compiling backend
    rounds it as it rounds `none`'s); the segmented copy is never lowered whole, only its segments run
    (AOTInductor packages the other two ahead of time)."""
    checkpoint = swift_checkpoint("llama")
    report = compile_engine(CompileRequest(model=str(checkpoint), method="swift", output=tmp_path / "e",
                                           backend=backend, dtype="bfloat16", max_seq_len=96, settings=RUN_SETTINGS))
    assert report["lossless"]
    assert set(report.get("lowered", {})) == ({"target", "draft"} if backend == "aoti" else set())
    assert report["graphs"]["skipping"]["lowered"] is False and "lowered" not in report["graphs"]["target"]
    none = compile_engine(CompileRequest(model=str(checkpoint), method="none", output=tmp_path / "n",
                                         dtype="bfloat16", max_seq_len=96))
    passes = lambda r, graph: [(p["pass_name"], p["config"]) for p in r["passes"] if p["graph"] == graph]
    assert passes(report, "target") == passes(none, "target")
    engine = load_engine(tmp_path / "e")
    assert engine.context.graphs["skipping"] is engine.context.modules["skipping"]
