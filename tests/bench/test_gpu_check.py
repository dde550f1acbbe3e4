"""benchmarks/gpu_check.sh and gpu_check.py before any GPU: the stages parse their settings,
join the carried model halves and plan the groups. A mistake here costs a whole GPU loan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.scripts import BENCHMARKS, load_benchmark

SCRIPT = BENCHMARKS / "gpu_check.sh"
SETTINGS = ("BUDGET", "KERNELS_BUDGET", "CHECK_GROUPS", "CHECK_DEVICE", "SELECT", "SPECC_GPU_CARRY", "CALL_LIMIT",
            "PROMPTS", "NEW_TOKENS", "REPEATS", "SPECC_GPU_ENGINE_NAMES")


def _carry(root: Path, model: bytes) -> Path:
    """What `gpu_check.sh prepare` leaves of the model (`split`: two sha256-checked halves; no wheels)."""
    carry, path = root / "carry", root / "model.gguf"
    path.write_bytes(model)
    split = _run_stage(root, "split", str(path), SPECC_GPU_CARRY=str(carry))
    assert split.returncode == 0, split.stderr
    return carry


def _run_stage(tmp_path: Path, stage: str, *args: str, **env) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    variables = {**inherited, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                 "OUT": str(tmp_path / "out"), "SPECC_GPU_KEEP": str(tmp_path / "keep"), **env}
    return subprocess.run(["bash", str(SCRIPT), stage, *args], env=variables, capture_output=True, text=True,
                          timeout=300)


def test_stash_then_smollm2_join_the_parts_and_plan_every_group(tmp_path):
    """Budget 1 s: the parts are joined and checked, then every compile is skipped by the budget
    and recorded, in the groups' order; no group name comes from bash's own GROUPS variable."""
    model = os.urandom(1001)
    carry = _carry(tmp_path, model)
    stash = _run_stage(tmp_path, "stash", SPECC_GPU_CARRY=str(carry), KERNELS_BUDGET="1")
    assert stash.returncode == 0, stash.stderr
    smollm2 = _run_stage(tmp_path, "smollm2", SPECC_GPU_CARRY=str(carry), BUDGET="1", CHECK_DEVICE="cpu")
    assert "unknown group" not in smollm2.stderr
    assert (tmp_path / "keep" / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() == model
    report = json.loads((tmp_path / "out" / "gpu-check" / "gpu-check.json").read_text())
    engines = [step["engine"] for step in report["compiles"]]
    assert engines == ["none-inductor", "prompt-lookup-inductor", "kangaroo-inductor", "none+kernels-inductor",
                       "eagle-inductor", "none-aoti", "prompt-lookup-aoti", "kangaroo-aoti"]
    assert all("skipped" in step for step in report["compiles"])
    assert smollm2.returncode == 1   # nothing was benchmarked


def test_check_groups_picks_groups_and_an_unknown_one_is_refused(tmp_path):
    carry = _carry(tmp_path, b"0123456789")
    _run_stage(tmp_path, "stash", SPECC_GPU_CARRY=str(carry), KERNELS_BUDGET="1")
    picked = _run_stage(tmp_path, "smollm2", SPECC_GPU_CARRY=str(carry), BUDGET="1", CHECK_GROUPS="kangaroo")
    report = json.loads((tmp_path / "out" / "gpu-check" / "gpu-check.json").read_text())
    assert [step["engine"] for step in report["compiles"]] == ["none-inductor", "kangaroo-inductor"], picked.stderr
    refused = _run_stage(tmp_path, "smollm2", SPECC_GPU_CARRY=str(carry), CHECK_GROUPS="inductor,bogus")
    assert refused.returncode == 2 and "unknown group(s) bogus" in refused.stderr


def test_a_corrupt_half_stops_the_smollm2_stage(tmp_path):
    carry = _carry(tmp_path, b"0123456789abcdef")
    _run_stage(tmp_path, "stash", SPECC_GPU_CARRY=str(carry), KERNELS_BUDGET="1")
    (carry / "part2" / "model.gguf.1").write_bytes(b"corrupted")
    result = _run_stage(tmp_path, "smollm2", SPECC_GPU_CARRY=str(carry), BUDGET="1")
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr
    assert not (tmp_path / "out" / "gpu-check" / "gpu-check.json").exists()


@pytest.mark.parametrize("engines,expected", [(1, 85 + 40 + 120), (2, 85 + 15 + 40 + 120)])
def test_the_headline_group_reserves_its_load_runs_and_hf(engines, expected):
    check = load_benchmark("gpu_check")
    assert check.bench_reserve(check.select_groups("inductor")[0], engines) == expected


def test_the_kangaroo_group_is_measured_beside_the_inductor_none():
    check = load_benchmark("gpu_check")
    (kangaroo,) = check.select_groups("kangaroo")
    planned = check.engines_to_compile(kangaroo, tried=set())
    assert [owner.engine(method) for owner, method in planned] == ["none-inductor", "kangaroo-inductor"]
    assert check.engines_to_compile(kangaroo, tried={"none-inductor"}) == [(kangaroo, "kangaroo")]
