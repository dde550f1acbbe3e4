"""benchmarks/compare_backends.py: one run over several backends on a tiny random checkpoint."""

from __future__ import annotations

import json

import pytest

from specc.testing.checkpoints import build_tiny_checkpoint
from tests.bench.scripts import load_benchmark


@pytest.fixture(scope="module")
def compare_backends():
    return load_benchmark("compare_backends")


def test_compares_backends_in_one_run(compare_backends, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "tiny-ckpt", num_hidden_layers=1)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w5 w17 w9 w30\n\nw40 w41 w8\n")
    results, engines = tmp_path / "results", tmp_path / "engines"
    argv = ["--model-spec", str(checkpoint), "--backends", "eager,onnx", "--prompts", str(prompts),
            "--num-prompts", "2", "--max-new-tokens", "8", "--repeats", "1", "--max-seq-len", "64",
            "--engines-dir", str(engines), "--results-dir", str(results)]
    assert compare_backends.main(argv) == 0

    [json_path] = results.glob("*-tiny-ckpt-backends.json")
    suite = json.loads(json_path.read_text())
    assert suite["settings"]["max_seq_len"] == 64 and suite["hf_greedy"]["tokens_per_second"]["median"] > 0
    assert list(suite["backends"]) == ["eager", "onnx"]
    for backend, result in suite["backends"].items():
        assert result["status"] == "ok", result
        assert result["compiled_in_this_run"]
        assert result["tokens_per_second"]["median"] > 0 and result["speedup_over_hf_greedy"]["median"] > 0
        assert result["identity_vs_hf_greedy"]["total"] == 2
        assert result["identity_vs_hf_greedy"]["identical"] == 2, "a none engine must reproduce HF greedy"
        assert result["load_seconds"] > 0 and result["compile_seconds"] > 0
    assert suite["backends"]["eager"]["speedup_over_eager"]["median"] == pytest.approx(1.0)
    assert suite["backends"]["eager"]["artifact_bytes"] == 0
    assert suite["backends"]["onnx"]["artifact_bytes"] > 0
    assert "target.onnx" in suite["backends"]["onnx"]["artifacts"]["target"]

    table = json_path.with_suffix(".md").read_text()
    assert table in capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split(" | ")[0] for row in rows] == ["| `eager`", "| `onnx`"]
    assert all(" | 2/2 | " in row for row in rows)
    assert (f"`OMP_NUM_THREADS=1 python benchmarks/compare_backends.py --model-spec {checkpoint} --backends eager,onnx "
            f"--prompts {prompts} --num-prompts 2 --max-new-tokens 8 --repeats 1 --max-seq-len 64`") in table

    # A second run reuses the engines; a backend this machine cannot use is skipped, not failed.
    argv[argv.index("eager,onnx")] = "eager,no-such-backend"
    assert compare_backends.main(argv) == 0
    suite = json.loads(json_path.read_text())
    assert not suite["backends"]["eager"]["compiled_in_this_run"]
    assert suite["backends"]["no-such-backend"]["status"] == "skipped"
    assert "- `no-such-backend` skipped: unknown backend" in json_path.with_suffix(".md").read_text()
