"""benchmarks/step_profile.py: a quantized engine's decode step split into kernel calls, gaps,
the graph's entry and exit, and the loop outside it."""

from __future__ import annotations

import json

import pytest

from specc.compiler import CompileRequest, compile_engine
from specc.kernels.call_trace import TracedCall
from tests.bench.scripts import load_benchmark


@pytest.fixture(scope="module")
def step_profile():
    return load_benchmark("step_profile")


def test_a_step_is_split_into_parts_that_add_up(step_profile):
    spans = [(0, 1_000_000), (1_200_000, 2_000_000), (2_100_000, 2_150_000)]
    calls = [TracedCall(1_300_000, 1_500_000, "matmul"), TracedCall(1_600_000, 1_700_000, "attention"),
             TracedCall(1_750_000, 1_850_000, "chain"), TracedCall(1_900_000, 1_950_000, "matmul")]
    (step,) = step_profile.split_steps(spans, calls)   # the third call traced nothing
    assert step == {"matmul": 250.0, "chain": 100.0, "attention": 100.0, "gaps": 200.0, "entry_exit": 150.0,
                    "outside": 200.0, "token": 1000.0, "calls": 4}
    assert sum(step[part] for part in step_profile.PARTS) == step["token"]


def test_it_profiles_a_q4_engine(step_profile, checkpoints, tmp_path, capsys):
    engine = tmp_path / "q4"
    compile_engine(CompileRequest(model=str(checkpoints("llama")[0]), method="none", output=engine,
                                  dtype="bfloat16", quantize="q4", max_seq_len=96))
    assert step_profile.main([str(engine), "--num-prompts", "1", "--max-new-tokens", "6", "--name", "tiny",
                              "--results-dir", str(tmp_path / "results")]) == 0
    assert "| matmul | chain | attention | gaps |" in capsys.readouterr().out
    (written,) = (tmp_path / "results").glob("*-tiny-step-profile.json")
    medians = json.loads(written.read_text())["median_us"]
    assert medians["calls"] > 0 and medians["chain"] > 0 and medians["token"] >= medians["matmul"] + medians["chain"]
