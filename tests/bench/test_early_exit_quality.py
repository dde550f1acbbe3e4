"""benchmarks/early_exit_quality.py: a lossy SpecEE engine's quality against the dense model."""

from __future__ import annotations

from pathlib import Path

import pytest

from specc.compiler import CompileRequest, compile_engine
from tests.bench.scripts import load_benchmark

pytestmark = pytest.mark.shared_data   # reads ../shared/data when present (CI reruns it hidden)

TRAIN = ["train_steps=10", "train_windows=4", "predictor_windows=2", "eval_sequences=2", "predictor_epochs=2",
         "train_seq_len=32", "mode=ar", "offline_layers=4"]


@pytest.fixture(scope="module")
def quality():
    return load_benchmark("early_exit_quality")


def engine(checkpoints, directory: Path, threshold: float) -> Path:
    compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="specee", output=directory,
                                  max_seq_len=96, settings=TRAIN + [f"exit_threshold={threshold}"]))
    return directory


def test_an_engine_that_never_exits_agrees_everywhere(quality, checkpoints, tmp_path):
    report = quality.measure(engine(checkpoints, tmp_path / "e", 0.999999), "code", 3, 12)
    assert report["teacher_forced_agreement"] == 1.0
    assert report["identical_prompts"] == report["num_prompts"] == 3
    assert report["mean_layers_executed"] == report["num_layers"]


def test_an_exiting_engine_reports_fewer_layers(quality, checkpoints, tmp_path):
    report = quality.measure(engine(checkpoints, tmp_path / "e", 0.001), "code", 3, 12)
    assert report["mean_layers_executed"] < report["num_layers"]
    assert 0.0 <= report["teacher_forced_agreement"] <= 1.0
    assert all(0 <= row["tokens_before_divergence"] <= 12 for row in report["per_prompt"])


def tree_engine(checkpoints, directory: Path, threshold: float) -> Path:
    settings = [s for s in TRAIN if not s.startswith("mode=")] + ["mode=tree", f"exit_threshold={threshold}"]
    compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="specee", output=directory,
                                  max_seq_len=96, settings=settings))
    return directory


def test_a_tree_engine_that_never_exits_agrees_everywhere(quality, checkpoints, tmp_path):
    report = quality.measure(tree_engine(checkpoints, tmp_path / "e", 0.999999), "code", 3, 12)
    assert report["teacher_forced_agreement"] == 1.0
    assert report["identical_prompts"] == report["num_prompts"] == 3
    assert report["mean_layers_executed"] == report["num_layers"]
    assert report["mean_accepted_length"] >= 1.0


def test_an_exiting_tree_engine_is_measured(quality, checkpoints, tmp_path):
    report = quality.measure(tree_engine(checkpoints, tmp_path / "e", 0.001), "code", 3, 12)
    assert report["mean_layers_executed"] <= report["num_layers"]
    assert 0.0 <= report["teacher_forced_agreement"] <= 1.0
    assert all(0 <= row["tokens_before_divergence"] <= 12 for row in report["per_prompt"])
    assert all(row["mean_accepted_path_layers"] <= report["num_layers"] for row in report["per_prompt"])
