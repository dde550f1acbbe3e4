"""SWIFT's search ends: candidates are never repeated, the search stops once every skip
set has been tried, and compile-time calibration shows a progress bar and stays short."""

from __future__ import annotations

import json
import time

from specc.compiler import CompileRequest, compile_engine
from specc.methods.swift.search import LayerSetSearch, SearchSettings
from specc.testing.checkpoints import build_tiny_checkpoint

FOUR = ("attn_1", "mlp_1", "attn_2", "mlp_2")


def test_the_search_stops_when_every_candidate_has_been_tried():
    search = LayerSetSearch(FOUR, SearchSettings(bayes_interval=2, max_tolerance=1000, max_tries=1000))
    assert search.num_skipped == 1 and search.space_size == 4
    tried = []
    while search.active:
        candidate = search.suggest()
        assert candidate not in tried, "a candidate is scored at most once"
        tried.append(candidate)
        search.report(candidate, 0.1 * len(tried))
    assert len(tried) == 4 and search.state.stop_reason == "all 4 candidate skip sets tried"


def test_a_single_candidate_space_starts_exhausted():
    search = LayerSetSearch(("attn_1", "mlp_1"), SearchSettings(skip_ratio=1.0), initial=frozenset(FOUR[:2]))
    assert search.space_size == 1 and not search.active


def test_compile_time_calibration_ends_within_the_space_and_shows_progress(tmp_path, capfd):
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "ckpt", num_hidden_layers=4)
    start = time.perf_counter()
    report = compile_engine(CompileRequest(model=str(checkpoint), method="swift", output=tmp_path / "engine",
                                           max_seq_len=128, settings=["calib_prompts=4"]))
    seconds = time.perf_counter() - start
    calibration = report["method_state"]["swift_calibration"]
    assert calibration["skippable"] == 4 and calibration["tries"] <= 4, calibration
    assert calibration["stop_reason"], calibration
    err = capfd.readouterr().err
    assert "swift skip-set search" in err and "best matchness" in err and "candidate sets" in err
    assert seconds < 60, seconds
    manifest = json.loads((tmp_path / "engine" / "manifest.json").read_text())
    assert manifest["method_state"]["swift_calibration"]["tries"] == calibration["tries"]
