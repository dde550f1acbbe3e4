"""Engines on a CUDA device: exactness, CUDA graph replay, training there, and the device errors.

The AOTInductor tests come late and load their engines in a process of their own: loading an
AOTI package for CUDA once crashed the process
(benchmarks/results/gpu-h100-smollm2-135m-bfloat16-gpu-check-2026-11-26.md). Only the `--kernels`
tests follow them (the kernels have their own benchmark in the GPU check).

Every test here needs a GPU (`-m gpu`); without one they skip. benchmarks/gpu_check.sh runs them.
`SPECC_GPU_TESTS_DEVICE=cpu` runs the same tests on the CPU (no CUDA graph checks): a rehearsal
of everything but the CUDA specifics, e.g. under another torch version.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.errors import UsageError
from specc.testing.checkpoints import sample_calibration_text, varied_prompts

DEVICE = os.environ.get("SPECC_GPU_TESTS_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                                  reason="needs a CUDA device")]
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="about CUDA itself")

MAX_SEQ_LEN = 128
NEW_TOKENS = 24
TRAIN = ["train_steps=40", "train_seq_len=32", "eval_sequences=2", "eval_every=20", "learning_rate=1e-2"]
TRAINED = {"kangaroo": TRAIN, "eagle": [*TRAIN, "draft_vocab_size=48"]}


def _hf_greedy_on_cuda(checkpoint: Path, prompts: list[list[int]], dtype=torch.float32) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).to(DEVICE).eval()
    with torch.inference_mode():
        return [model.generate(torch.tensor([ids], device=DEVICE), do_sample=False, max_new_tokens=NEW_TOKENS,
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=DEVICE)
                               )[0, len(ids):].tolist() for ids in prompts]


@pytest.fixture(scope="module")
def compiled(checkpoints, tmp_path_factory):
    """(method, backend, dtype, kernels) -> engine directory, compiled once for this module on
    DEVICE; kangaroo and eagle train briefly on text the target samples."""
    built: dict[tuple, Path] = {}

    def get(method: str, backend: str, dtype: str = "float32", kernels: bool = False) -> Path:
        key = (method, backend, dtype, kernels)
        if key not in built:
            target = checkpoints("llama")[0]
            root = tmp_path_factory.mktemp(f"{method}-{backend}-{dtype}{'-kernels' if kernels else ''}")
            settings = []
            if method in TRAINED:
                calib = sample_calibration_text(target, root / "calib.txt", sequences=32)
                settings = [*TRAINED[method], f"calib_data={calib}"]
            report = compile_engine(CompileRequest(model=str(target), method=method, output=root / "engine",
                                                   backend=backend, dtype=dtype, max_seq_len=MAX_SEQ_LEN,
                                                   settings=settings, device=DEVICE, kernels=kernels))
            assert report["device"] == DEVICE
            built[key] = root / "engine"
        return built[key]

    return get


def _decode(engine, prompts) -> list[list[int]]:
    return [engine.generate_ids(ids, NEW_TOKENS).token_ids for ids in prompts]


def _assert_replayed(engine) -> None:
    if DEVICE == "cpu":
        return
    assert engine.cuda_graphs, "no graph runs from CUDA graphs"
    assert sum(g.replays for g in engine.cuda_graphs.values()) > 0
    assert not any(g.uncapturable for g in engine.cuda_graphs.values()), \
        {name: g.uncapturable for name, g in engine.cuda_graphs.items()}


def test_prompt_lookup_in_bfloat16_matches_its_none_engine(checkpoints, compiled, prompt_lookup_method):
    prompts = [ids + ids[:6] for ids in varied_prompts(6, 96, seed=5)]   # repeats give lookups something to find
    none = load_engine(compiled("none", "inductor", "bfloat16"), device=DEVICE)
    lookup = load_engine(compiled("prompt-lookup", "inductor", "bfloat16"), device=DEVICE)
    results = [lookup.generate_ids(ids, NEW_TOKENS) for ids in prompts]
    assert [r.token_ids for r in results] == _decode(none, prompts)
    assert sum(r.stats.drafted_tokens for r in results) > 0
    _assert_replayed(lookup)


@pytest.mark.parametrize("method,backend", [("kangaroo", "eager"), ("kangaroo", "inductor"), ("eagle", "inductor")])
def test_a_method_trained_on_the_device_matches_hf_greedy(checkpoints, compiled, method, backend):
    target = checkpoints("llama")[0]
    engine = load_engine(compiled(method, backend), device=DEVICE)
    assert engine.manifest["training"]["device"].startswith(DEVICE)
    prompts = varied_prompts(6, 96, seed=4)
    results = [engine.generate_ids(ids, NEW_TOKENS) for ids in prompts]
    assert [r.token_ids for r in results] == _hf_greedy_on_cuda(target, prompts)
    assert sum(r.stats.accepted_tokens for r in results) > 0
    _assert_replayed(engine)


@pytest.mark.parametrize("method", ["kangaroo", "eagle"])
def test_a_trained_method_in_bfloat16_matches_its_none_engine(compiled, method):
    prompts = varied_prompts(6, 96, seed=6)
    none = load_engine(compiled("none", "inductor", "bfloat16"), device=DEVICE)
    trained = load_engine(compiled(method, "inductor", "bfloat16"), device=DEVICE)
    assert _decode(trained, prompts) == _decode(none, prompts)


@cuda_only
def test_an_eager_engine_compiled_for_the_cpu_runs_on_cuda(checkpoints, tmp_path):
    target = checkpoints("llama")[0]
    output = tmp_path / "cpu-engine"
    compile_engine(CompileRequest(model=str(target), method="none", output=output, max_seq_len=MAX_SEQ_LEN,
                                  device="cpu"))
    prompts = varied_prompts(3, 96, seed=8)
    on_cpu = _decode(load_engine(output, device="cpu"), prompts)
    assert _decode(load_engine(output, device=DEVICE), prompts) == on_cpu


@cuda_only
def test_a_cache_too_large_for_the_gpu_is_a_clear_error(compiled, monkeypatch):
    path = compiled("none", "eager")

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    from specc.runtime import kv_cache
    monkeypatch.setattr(kv_cache.KVCache, "__init__", out_of_memory)
    with pytest.raises(UsageError, match="does not fit in the device's memory"):
        load_engine(path, device=DEVICE)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_none_engine_on_cuda_matches_hf_greedy_and_replays_cuda_graphs(checkpoints, compiled, backend):
    target = checkpoints("llama")[0]
    prompts = varied_prompts(6, 96, seed=3)
    engine = load_engine(compiled("none", backend), device=DEVICE)
    assert engine.device.type == DEVICE
    assert _decode(engine, prompts) == _hf_greedy_on_cuda(target, prompts)
    _assert_replayed(engine)


# Loads an engine, decodes and prints what the AOTI tests check, in a process of its own: loading
# an AOTI package for CUDA once crashed the whole process (segmentation fault, cause unknown), and
# a crash here should fail one test with its stack, not end the run.
_DECODE_ELSEWHERE = """
import json, sys
from specc.engine.loaded import load_engine
path, device, new, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
engine = load_engine(path, device=None if device == "auto" else device)
tokens = [engine.generate_ids(ids, new).token_ids for ids in prompts]
graphs = engine.cuda_graphs.values()
print(json.dumps({"device": engine.device.type, "tokens": tokens, "replays": sum(g.replays for g in graphs),
                  "uncapturable": sum(len(g.uncapturable) for g in graphs)}))
"""


def _in_own_process(script: str, *args: str, timeout: float):
    """`script` run by this Python with `args`, in a process of its own (a crash there is its return code)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", script, *args], capture_output=True,
                          text=True, timeout=timeout)


def _decode_in_own_process(path: Path, prompts, device: str = DEVICE) -> dict:
    import json

    done = _in_own_process(_DECODE_ELSEWHERE, str(path), device, str(NEW_TOKENS), json.dumps(prompts), timeout=900)
    if done.returncode != 0:
        pytest.fail(f"loading or decoding {path.name} ended with rc {done.returncode}:\n{done.stderr[-4000:]}"
                    f"{_aoti_probes(path, device)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# Where the AOTI crash is, when there is one: each probe in a process of its own loads the
# engine's packages one way and stops at a different point, so a failed test says which of
# loading, loading without AOTInductor's thread synchronisation (what CUDA graph capture needs,
# specc.lower.aoti) or decoding with the default loader is the one that crashes.
_AOTI_PROBE = """
import sys
from pathlib import Path
import torch
path, device, probe = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
packages = sorted((path / "compiled").glob("*.pt2"))
if probe == "decode, default loader":
    import specc.lower.aoti as aoti
    from specc.engine.loaded import load_engine
    aoti._load_package = lambda package, device: torch._inductor.aoti_load_package(str(package))
    engine = load_engine(str(path), device=None if device == "auto" else device)
    print(engine.generate_ids([5, 9, 14], 4).token_ids, flush=True)
else:
    for package in packages:
        print("loading", package.name, flush=True)
        if probe == "load, single-threaded":
            torch._inductor.aoti_load_package(str(package), run_single_threaded=True,
                                              **({} if device == "cpu" else {"device_index": 0}))
        else:
            torch._inductor.aoti_load_package(str(package))
print("probe done", flush=True)
"""
AOTI_PROBES = ("load", "load, single-threaded", "decode, default loader")


def _aoti_probes(path: Path, device: str) -> str:
    """What each of `AOTI_PROBES` did on the engine at `path`, for a failure message."""
    import subprocess

    lines = ["\n\nAOTI probes, each in its own process:"]
    for probe in AOTI_PROBES:
        try:
            done = _in_own_process(_AOTI_PROBE, str(path), device, probe, timeout=600)
            lines.append(f"- {probe}: rc {done.returncode}; stdout {done.stdout.strip()[-300:]!r}; "
                         f"stderr tail {done.stderr.strip()[-1500:]!r}")
        except subprocess.TimeoutExpired:
            lines.append(f"- {probe}: timed out after 600 s")
    return "\n".join(lines)


def test_an_aoti_none_engine_on_cuda_matches_hf_greedy_and_replays_cuda_graphs(checkpoints, compiled):
    target = checkpoints("llama")[0]
    prompts = varied_prompts(6, 96, seed=3)
    decoded = _decode_in_own_process(compiled("none", "aoti"), prompts)
    assert decoded["device"] == DEVICE
    assert decoded["tokens"] == _hf_greedy_on_cuda(target, prompts)
    if DEVICE == "cuda":
        assert decoded["replays"] > 0 and decoded["uncapturable"] == 0, decoded


@cuda_only
def test_an_aoti_engine_for_cuda_refuses_the_cpu(compiled):
    path = compiled("none", "aoti")
    with pytest.raises(UsageError, match="compiled for cuda"):
        load_engine(path, device="cpu")
    assert _decode_in_own_process(path, [[5, 9, 14]], "auto")["device"] == "cuda"   # auto: where its packages run


def test_none_with_specc_kernels_matches_hf_greedy(checkpoints, compiled):
    """`--kernels` swaps every attention for `torch.ops.specc.tree_attention` (Triton on CUDA)."""
    target = checkpoints("llama")[0]
    prompts = varied_prompts(6, 96, seed=9)
    engine = load_engine(compiled("none", "inductor", kernels=True), device=DEVICE)
    assert engine.manifest["kernels"], "no graph calls specc's kernels"
    assert _decode(engine, prompts) == _hf_greedy_on_cuda(target, prompts)
    _assert_replayed(engine)


def test_kangaroo_with_specc_kernels_in_bfloat16_matches_its_none_engine(compiled):
    """In bfloat16 another attention rounds differently, so the reference is the `none` engine
    with the same kernels: verification must reproduce its tokens exactly."""
    prompts = varied_prompts(6, 96, seed=10)
    none = load_engine(compiled("none", "inductor", "bfloat16", kernels=True), device=DEVICE)
    kangaroo = load_engine(compiled("kangaroo", "inductor", "bfloat16", kernels=True), device=DEVICE)
    results = [kangaroo.generate_ids(ids, NEW_TOKENS) for ids in prompts]
    assert [r.token_ids for r in results] == _decode(none, prompts)
    assert sum(r.stats.accepted_tokens for r in results) > 0
    _assert_replayed(kangaroo)
