"""benchmarks/run_all.py: the markdown table, the RESULTS.md section, the draft check."""

from __future__ import annotations

import json

import pytest

from specc.testing.checkpoints import build_tiny_checkpoint
from tests.bench.scripts import load_benchmark


@pytest.fixture(scope="module")
def run_all():
    return load_benchmark("run_all")


def _bench(identical=3, flag=False):
    spread = {"median": 1.5, "min": 1.4, "max": 1.6, "n": 3}
    return {
        "engine": {"lossless": True},
        "systems": [{"name": "hf-greedy", "label": "HF generate, greedy"},
                    {"name": "specc-none", "label": "specc none"}, {"name": "engine", "label": "specc x"}],
        "identity": {"identical": identical, "total": 3}, "identity_flag": flag,
        "overall": {
            "systems": {"hf-greedy": {"tokens_per_second": {"median": 10.0}},
                        "specc-none": {"tokens_per_second": {"median": 12.0}},
                        "engine": {"tokens_per_second": {"median": 18.0},
                                   "acceptance": {"mean_accepted_length": 2.5, "acceptance_rate": 0.25,
                                                  "step_acceptance_rate": 0.75}}},
            "speedup": {"hf-greedy": spread, "specc-none": spread},
            "prediction": {"swift_eq6": {"expected_speedup": 1.7, "with_measured_verify": 1.2}},
        },
    }


def _suite():
    return {"device": "cpu-test", "model_spec": "tiny",
            "settings": {"prompts": "code", "num_prompts": 4, "max_new_tokens": 32, "repeats": 3,
                         "backend": "eager", "quick": True},
            "methods": {"draft-model": {"status": "skipped", "note": "no usable draft model: sizes differ"},
                        "good": {"status": "ok", "note": None, "bench": _bench()},
                        "bad": {"status": "ok", "note": None, "bench": _bench(identical=2, flag=True)}}}


def test_markdown_table(run_all):
    table = run_all.markdown_table(_suite())
    row = "| `good` | yes | 18.0 | 1.50× (1.40–1.60) | 1.50× (1.40–1.60) | — | — | 2.50 | 0.75 | 0.25 | 3/3 | 1.70× | 1.20× |"
    assert row in table
    assert "| 2/3 ⚠ |" in table
    assert "- `draft-model` skipped: no usable draft model: sizes differ" in table
    assert "--quick" in table and "HF generate, greedy 10.0" in table


def test_results_section_is_replaced_only_between_markers(run_all, tmp_path):
    page = tmp_path / "RESULTS.md"
    page.write_text("intro\n<!-- bench:begin -->\nold table\n<!-- bench:end -->\noutro\n")
    assert run_all.update_results(page, "| new |\n")
    assert page.read_text() == "intro\n<!-- bench:begin -->\n| new |\n<!-- bench:end -->\noutro\n"
    page.write_text("no markers here\n")
    assert not run_all.update_results(page, "| new |\n")
    assert page.read_text() == "no markers here\n"
    assert not run_all.update_results(tmp_path / "missing.md", "x")


def test_update_results_writes_benchmarks_results_md_not_the_readme(run_all):
    assert run_all.RESULTS_PAGE == run_all.REPO / "benchmarks" / "RESULTS.md"
    assert run_all.parse_args(["--update-results"]).update_results
    with pytest.raises(SystemExit):
        run_all.parse_args(["--update-readme"])
    text = run_all.RESULTS_PAGE.read_text()
    assert 0 <= text.find(run_all.RESULTS_BEGIN) < text.find(run_all.RESULTS_END), \
        "RESULTS.md keeps the markers around the generated tables"
    assert run_all.RESULTS_BEGIN not in (run_all.REPO / "README.md").read_text()


def test_no_generated_line_is_longer_than_400_characters(run_all):
    suite = _suite()
    suite["settings"].update(quick=False, tag="distilled-draft-v8k-code", methods="none,draft-model",
                             draft="build/drafts/smollm2-l4", engines_from="smollm2-135m-aoti-code",
                             method_settings={"draft-model": ["draft_vocab_size=8192", "stop_threshold=0.6"]})
    assert max(map(len, run_all.markdown_table(suite).splitlines())) <= 400


def test_results_section_orders_every_committed_suite(run_all, tmp_path):
    for spec, backend in (("tiny", "eager"), ("small", "inductor"), ("small", "eager")):
        suite = _suite() | {"model_spec": spec, "schema": run_all.SUITE_SCHEMA}
        suite["settings"] = suite["settings"] | {"backend": backend, "quick": False}
        (tmp_path / f"{run_all.results_stem(suite)}.json").write_text(json.dumps(suite))
    (tmp_path / "other.json").write_text("{}")
    section = run_all.results_section(tmp_path)
    headers = [line.split(".**")[0] for line in section.splitlines() if line.startswith("**")]
    assert headers == ["**tiny, eager, cpu-test", "**small, eager, cpu-test", "**small, inductor, cpu-test"]
    assert "--model-spec small --backend inductor --num-prompts 4 --max-new-tokens 32`" in section
    assert sorted(p.name for p in tmp_path.glob("*.json"))[:3] == ["cpu-test-small-inductor.json",
                                                                   "cpu-test-small.json", "cpu-test-tiny.json"]


def test_a_tuned_variant_is_named_and_reproducible(run_all):
    with pytest.raises(SystemExit):
        run_all.parse_args(["--set", "swift:tree_widths=1,2,3,4"])           # no --tag
    with pytest.raises(SystemExit):
        run_all.parse_args(["--set", "tree_widths=1,2,3,4", "--tag", "x"])   # no METHOD:
    args = run_all.parse_args(["--methods", "swift", "--set", "swift:tree_widths=1,2,3,4",
                               "--set", "swift:adapt=false", "--tag", "narrow"])
    assert args.method_settings == {"swift": ["tree_widths=1,2,3,4", "adapt=false"]}
    suite = _suite()
    suite["settings"] |= {"tag": "narrow", "method_settings": args.method_settings, "methods": "swift",
                          "quick": False}
    assert run_all.results_stem(suite) == "cpu-test-tiny-narrow"
    table = run_all.markdown_table(suite)
    assert "variant `narrow` (swift: tree_widths=1,2,3,4, adapt=false)" in table
    assert ("`python benchmarks/run_all.py --model-spec tiny --methods swift --set swift:tree_widths=1,2,3,4 "
            "--set swift:adapt=false --tag narrow --num-prompts 4 --max-new-tokens 32`") in table, \
        "the command must reproduce the run, non-default prompt settings included"


def test_draft_vocabulary_check(run_all, tmp_path):
    a = build_tiny_checkpoint("llama", tmp_path / "a", num_hidden_layers=1)
    b = build_tiny_checkpoint("llama", tmp_path / "b", seed=1, num_hidden_layers=1)
    c = build_tiny_checkpoint("llama", tmp_path / "c", num_hidden_layers=1, vocab_size=80)
    assert run_all.vocabulary_mismatch(a, b) is None
    assert "vocabulary sizes differ" in run_all.vocabulary_mismatch(a, c)


def test_quick_defaults(run_all):
    args = run_all.parse_args(["--quick"])
    assert (args.model_spec, args.num_prompts, args.max_new_tokens) == ("tiny", 4, 32)
    args = run_all.parse_args([])
    assert (args.model_spec, args.num_prompts, args.max_new_tokens) == ("small", 16, 64)


def test_a_given_draft_is_named_in_the_reproduction_command(run_all):
    suite = _suite()
    suite["settings"].update(quick=False, draft="build/drafts/smollm2-l4")
    assert "--draft build/drafts/smollm2-l4" in run_all.markdown_table(suite)
    assert "--draft" not in run_all.markdown_table(_suite())


def test_a_given_draft_replaces_the_default_one(run_all, monkeypatch, tmp_path):
    import specc.refmodels

    monkeypatch.setattr(specc.refmodels, "build_reference_model", lambda spec: tmp_path / spec)
    assert run_all.source_models("small") == (tmp_path / "small", tmp_path / "tiny")
    assert run_all.source_models("small", tmp_path / "mine") == (tmp_path / "small", tmp_path / "mine")


def test_engines_from_reuses_an_earlier_suites_engines_and_checks_their_backend(run_all, tmp_path):
    from specc.errors import UsageError

    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "manifest.json").write_text(json.dumps({"backend": "onnx"}))
    reuse = run_all.reuse_compiled("onnx")
    assert reuse("none", None, None, tmp_path, "onnx", 1024) == tmp_path / "none"
    with pytest.raises(UsageError, match="built for onnx, not aoti"):
        run_all.reuse_compiled("aoti")("none", None, None, tmp_path, "aoti", 1024)
    with pytest.raises(UsageError, match="no kangaroo engine"):
        reuse("kangaroo", None, None, tmp_path, "onnx", 1024)


def test_engines_from_refuses_settings_it_could_not_apply(run_all):
    with pytest.raises(SystemExit):
        run_all.parse_args(["--engines-from", "x", "--set", "swift:tree_widths=1", "--tag", "t"])
    args = run_all.parse_args(["--engines-from", "smollm2-135m-onnx-code", "--tag", "gsm8k"])
    suite = _suite()
    suite["settings"].update(quick=False, engines_from=args.engines_from)
    assert "--engines-from smollm2-135m-onnx-code" in run_all.markdown_table(suite)


def test_a_reduced_precision_suite_is_named_and_reproducible(run_all):
    args = run_all.parse_args(["--backend", "aoti", "--dtype", "bfloat16", "--tag", "code"])
    assert run_all.variant_name("smollm2-135m", args.backend, args.tag, args.dtype) == "smollm2-135m-aoti-bfloat16-code"
    suite = _suite()
    suite["settings"].update(quick=False, backend="aoti", dtype="bfloat16", tag="code")
    assert run_all.results_stem(suite) == "cpu-test-tiny-aoti-bfloat16-code"
    table = run_all.markdown_table(suite)
    assert "**tiny, aoti, bfloat16, cpu-test, variant `code`.**" in table
    assert "--backend aoti --dtype bfloat16 --tag code" in table
    assert "bfloat16" not in run_all.markdown_table(_suite()), "float32, the default, goes unsaid"


def test_engines_from_checks_the_engines_dtype(run_all, tmp_path):
    from specc.errors import UsageError

    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "manifest.json").write_text(json.dumps({"backend": "aoti", "dtype": "bfloat16"}))
    assert run_all.reuse_compiled("aoti", "bfloat16")("none", None, None, tmp_path) == tmp_path / "none"
    with pytest.raises(UsageError, match="holds bfloat16 weights, not float32"):
        run_all.reuse_compiled("aoti")("none", None, None, tmp_path)
