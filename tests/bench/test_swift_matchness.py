"""benchmarks/swift_matchness.py scores both skip sets on the same windows."""

from __future__ import annotations

from specc.compiler import CompileRequest, compile_engine
from specc.testing.checkpoints import build_tiny_checkpoint
from tests.bench.scripts import load_benchmark


def test_initial_and_stored_sets_are_scored_on_held_out_prompts(tmp_path):
    module = load_benchmark("swift_matchness")
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "target", num_hidden_layers=4)
    compile_engine(CompileRequest(model=str(checkpoint), method="swift", output=tmp_path / "engine",
                                  max_seq_len=96, settings=["calib_prompts=0", "context_window=8",
                                                            "max_draft_tokens=4"]))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w5 w9 w12\n\nw7 w7 w8 w40\n\nw9 w3\n")
    result = module.measure(str(tmp_path / "engine"), str(prompts), skip_first=1, num_prompts=2,
                            max_new_tokens=16)
    assert result["initial"]["skip"] == result["stored"]["skip"] == "attn 1 · mlp 1"   # uncalibrated: odd layers
    for entry in result.values():
        assert len(entry["scores"]) == 2 and all(0.0 <= s <= 1.0 for s in entry["scores"])
    assert result["initial"]["scores"] == result["stored"]["scores"]
