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
    assert report["greedy_accept"]["identical"] and report["sample_accept"]["identical"]
    (live,) = report["empty_cache"]   # 96 slots holding 20 tokens: two splits in the interpreter, one read
    assert (live["slots"], live["live"]) == (96, 20) and live["kernel_bitwise_equal"]
    (sweep,) = report["row_invariance"]
    assert sweep["dtype"] == "bfloat16" and sweep["kernel_invariant_calls"] == sweep["rows"] == 4
    assert all(row["kernel_row_invariant"] for row in report["attention"])
    (split,) = report["split_sweep"]   # graph timings need CUDA; every split size still runs and is checked
    assert split["graph_ms_by_split"] == {"16": None, "32": None}
    assert all(error < 1e-2 for error in split["error_by_split"].values())
    assert "| tiny | float32 | 24 | 3 |" in (tmp_path / "kernels-bench.md").read_text()


def test_the_gpu_variants_compile_for_sm90_without_a_gpu(tmp_path, triton_kernels):
    """What the interpreter cannot check (layouts, shared memory, tl.dot on bf16): the first autotune
    config of each kernel compiles for an H100 with Triton's bundled ptxas. A subprocess, since
    this session's kernels are imported for the interpreter."""
    import os
    import subprocess
    import sys

    import pytest
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this triton has no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--compile-only", "--first-config", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads((tmp_path / "kernels-compile.json").read_text())
    kernels = {entry["kernel"] for entry in compiled}
    assert kernels == {"_split_kernel", "_combine_kernel", "_row_argmax_kernel", "_walk_tree_kernel",
                       "_sample_accept_kernel"}
    assert {entry["FUSED"] for entry in compiled if entry["kernel"] == "_split_kernel"} == {True, False}
    assert all(entry["shared_bytes"] <= 227 * 1024 for entry in compiled)
