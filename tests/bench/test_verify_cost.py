"""benchmarks/verify_cost.py: the time of a q-row target forward against one row, per engine."""

from __future__ import annotations

import pytest

from specc.compiler import CompileRequest, compile_engine
from specc.errors import UsageError
from tests.bench.scripts import load_benchmark


@pytest.fixture(scope="module")
def verify_cost():
    return load_benchmark("verify_cost")


@pytest.fixture(scope="module")
def none_engine(checkpoints, tmp_path_factory):
    path = tmp_path_factory.mktemp("verify") / "none"
    compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="none", output=path, max_seq_len=64))
    return path


def test_each_engine_reports_every_row_count_against_one_row(verify_cost, none_engine, capsys):
    assert verify_cost.main([str(none_engine), str(none_engine), "--prefix", "20", "--rows", "2,5",
                             "--repeats", "2"]) == 0
    table = capsys.readouterr().out
    assert "q=1" in table and "q=5" in table and table.count("| eager |") == 2
    report = verify_cost.measure([none_engine], "target", 20, [1, 2, 5], 2)
    rows = report["engines"][0]["rows"]
    assert set(rows) == {"1", "2", "5"} and rows["1"]["ratio"] == 1.0
    assert all(r["ms"] > 0 for r in rows.values())


def test_the_bound_compares_the_one_row_call_with_the_read_rate(verify_cost, none_engine, monkeypatch):
    from specc.bench import bandwidth
    samples = bandwidth.BandwidthSamples
    monkeypatch.setattr(bandwidth, "BandwidthSamples", lambda: samples(read=lambda: 1e9))   # reads 1 GB/s
    report = verify_cost.measure([none_engine], "target", 20, [1], 3, bound=True)
    entry = report["engines"][0]
    limit = entry["bound"]
    assert limit["read_samples"] == 3 and limit["read_bytes_per_second"] == 10**9
    step = entry["rows"]["1"]["ms"] / 1000
    assert limit["share_of_bound"] == pytest.approx(limit["weight_bytes_per_token"] / 1e9 / step, rel=0.02)
    assert "of the bound" in verify_cost.format_table(report)


def test_bad_requests_are_clear_errors(verify_cost, none_engine):
    with pytest.raises(UsageError, match="has no graph 'draft'"):
        verify_cost.measure([none_engine], "draft", 20, [1], 1)
    with pytest.raises(UsageError, match="exceeds"):
        verify_cost.measure([none_engine], "target", 60, [1, 8], 1)
