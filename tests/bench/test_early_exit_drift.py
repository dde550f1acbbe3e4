"""benchmarks/early_exit_drift.py: which approximation after an early exit costs agreement."""

from __future__ import annotations

import pytest

from tests.bench.scripts import load_benchmark
from tests.bench.test_early_exit_quality import engine

pytestmark = pytest.mark.shared_data   # reads ../shared/data when present (CI reruns it hidden)


@pytest.fixture(scope="module")
def drift():
    return load_benchmark("early_exit_drift")


def test_an_engine_that_never_exits_needs_no_repair(drift, checkpoints, tmp_path):
    report = drift.measure(engine(checkpoints, tmp_path / "e", 0.999999), "code", 3, 12)
    assert report["teacher_forced_agreement"] == {name: 1.0 for name in drift.VARIANTS}


def test_an_exiting_engine_is_measured_four_ways(drift, checkpoints, tmp_path):
    """The unrepaired row is the agreement early_exit_quality reports for the same engine."""
    path = engine(checkpoints, tmp_path / "e", 0.001)
    report = drift.measure(path, "code", 3, 12)
    assert set(report["teacher_forced_agreement"]) == set(drift.VARIANTS)
    assert all(0.0 <= a <= 1.0 for a in report["teacher_forced_agreement"].values())
    assert report["positions"] == 3 * 11
    quality = drift._sibling("early_exit_quality").measure(path, "code", 3, 12)
    assert report["teacher_forced_agreement"]["engine"] == quality["teacher_forced_agreement"]
