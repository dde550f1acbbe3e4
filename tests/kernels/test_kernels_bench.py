"""benchmarks/kernels_bench.py runs end to end (tiny shapes, Triton's interpreter) and writes its table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels_bench.py"


def test_smoke_run_writes_times_errors_and_row_invariance(tmp_path, triton_kernels, one_thread):
    spec = importlib.util.spec_from_file_location("kernels_bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "kernels-bench.json").read_text())
    assert [(r["kv"], r["q"]) for r in report["attention"]] == [(24, 1), (24, 3)]
    for row in report["attention"]:
        assert row["kernel_error"] < 1e-5 and row["sdpa_error"] < 1e-5
        assert row["kernel_ms"] > 0 and row["sdpa_ms"] > 0
        assert row["kernel_row_invariant"] in (True, False)
    assert report["greedy_accept"]["identical"]
    assert "| tiny | float32 | 24 | 3 |" in (tmp_path / "kernels-bench.md").read_text()
