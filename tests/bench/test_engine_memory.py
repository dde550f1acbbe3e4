"""benchmarks/engine_memory.py: an engine's files and a fresh process's resident memory."""

from __future__ import annotations

import json

import pytest

from specc.compiler import CompileRequest, compile_engine
from tests.bench.scripts import load_benchmark


@pytest.fixture(scope="module")
def engine_memory():
    return load_benchmark("engine_memory")


def test_it_measures_an_engine_in_a_process_of_its_own(engine_memory, checkpoints, tmp_path, capsys):
    engine = tmp_path / "q4"
    compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="none", output=engine,
                                  dtype="bfloat16", quantize="q4", max_seq_len=96))
    assert engine_memory.main([str(engine), "--json", str(tmp_path / "memory.json")]) == 0
    assert f"| {engine} |" in capsys.readouterr().out
    (figures,) = json.loads((tmp_path / "memory.json").read_text())
    assert figures["files_bytes"] > 0 and figures["compiled_bytes"] == 0   # an eager engine compiles nothing
    for stage in ("before_load", "after_load", "after_decode"):
        assert set(figures[stage]) == set(engine_memory.FIELDS) and figures[stage]["VmRSS"] > 0
    assert figures["after_load"]["VmRSS"] > figures["before_load"]["VmRSS"]


def test_a_failed_measurement_says_which_engine(engine_memory, tmp_path):
    with pytest.raises(SystemExit, match="measuring .*missing failed"):
        engine_memory.main([str(tmp_path / "missing")])
