"""benchmarks/firp_accuracy.py: FIRP's per-step draft accuracy against early-exit and Medusa-style heads."""

from __future__ import annotations

import pytest

from specc.compiler import CompileRequest, compile_engine
from specc.testing.checkpoints import sample_calibration_text
from tests.bench.scripts import load_benchmark

TRAIN = ["train_steps=6", "train_seq_len=24", "train_windows=4", "eval_sequences=2", "eval_every=6"]


@pytest.fixture(scope="module")
def accuracy():
    return load_benchmark("firp_accuracy")


@pytest.fixture(scope="module")
def calibration(checkpoints, tmp_path_factory):
    return sample_calibration_text(checkpoints("llama")[0], tmp_path_factory.mktemp("calib") / "calib.txt",
                                   sequences=16, temperature=0.5)


def check(report: dict, layers: list[int]) -> None:
    assert [row["step"] for row in report["steps"]] == [1, 2, 3]
    assert [row["layer"] for row in report["steps"]] == layers == report["layers"]
    for row in report["steps"]:
        values = [row["firp"], *row["early_exit"].values(), *row["medusa"].values()]
        assert all(0.0 <= v <= 1.0 for v in values)
    assert report["parameters_per_step"] == 64 * 64 + 64 and report["heldout_windows"] == 2


def test_a_checkpoint_is_trained_then_compared(accuracy, checkpoints, calibration, capsys):
    assert accuracy.main([str(checkpoints("llama")[0]), *[f"--set={s}" for s in TRAIN],
                          f"--set=calib_data={calibration}"]) == 0
    out = capsys.readouterr().out
    assert "firp" in out and "medusa(tr.)" in out and len(out.strip().splitlines()) >= 5


def test_an_engine_reuses_its_projections(accuracy, checkpoints, calibration, tmp_path):
    engine = tmp_path / "engine"
    compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="firp", output=engine, max_seq_len=64,
                                  settings=[*TRAIN, f"calib_data={calibration}"]))
    report = accuracy.measure(engine, ["train_steps=4"])
    check(report, [1, 2, 2])
    assert report["train_steps"] == 4 and report["firp_training"][0]["steps"] == 6
