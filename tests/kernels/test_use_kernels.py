"""use_kernels: attention swapped for specc.tree_attention, same numbers, idempotent,
no-op elsewhere; and a `none` engine compiled with --kernels stays HF-greedy exact."""

from __future__ import annotations

import pytest
import torch

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.errors import SpeccError
from specc.graph.nodes import attention_nodes
from specc.engine.inspect_engine import inspect_engine
from specc.kernels import KERNELS, kernels_in_graph
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.specee.segment_by_layer import SegmentByLayer
from specc.passes.use_kernels import UseKernels
from specc.testing.checkpoints import build_tiny_checkpoint, captured_tiny, hf_greedy, non_matching_graph, run_cached_steps

IDS = torch.randint(4, 96, (1, 9), generator=torch.Generator().manual_seed(3))
CHUNKS = [(0, 6), (6, 7), (7, 9)]   # a prefill, one decode step, a two-token chunk
TREE_ATTENTION = KERNELS["tree_attention"].op


def cached_graph(family: str = "llama"):
    _, captured = captured_tiny(family)
    gm = captured.graph_module
    for graph_pass in infrastructure_passes():
        graph_pass(gm)
    return gm, captured.architecture


def kernel_calls(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == TREE_ATTENTION]


def test_every_cached_attention_is_swapped_and_logits_are_unchanged(triton_kernels):
    gm, arch = cached_graph("qwen3")   # GQA, explicit head_dim
    expected = run_cached_steps(gm, IDS, CHUNKS, arch)
    result = UseKernels()(gm)
    assert result.modified and len(result.replaced) == len(result.inserted) == arch.num_layers
    assert not attention_nodes(gm.graph) and len(kernel_calls(gm)) == arch.num_layers
    assert all(n.kwargs["scale"] == pytest.approx(arch.head_dim ** -0.5) for n in kernel_calls(gm))
    # the live length: computed once on the device, amax(cache slots) + 1, and given to every layer
    (live,) = {n.kwargs["kv_len"] for n in kernel_calls(gm)}
    assert live.target == torch.ops.aten.add.Tensor and live.args[1] == 1
    assert live.args[0].target == torch.ops.aten.amax.default and live.args[0].args[0].name == "cache_positions"
    torch.testing.assert_close(run_cached_steps(gm, IDS, CHUNKS, arch), expected, rtol=1e-4, atol=1e-5)
    assert kernels_in_graph(gm) == ["tree_attention"]
    assert not UseKernels()(gm).modified


def test_segments_are_rewritten_inside():
    gm, arch = cached_graph()
    segmented = SegmentByLayer()(gm).graph_module
    result = UseKernels()(segmented)
    assert result.modified and len(result.replaced) == arch.num_layers
    layers = [segmented.get_submodule(f"layer_{i}") for i in range(arch.num_layers)]
    assert all(len(kernel_calls(layer)) == 1 and not attention_nodes(layer.graph) for layer in layers)
    for layer in layers:   # each segment computes the live length from the slots it writes
        (kernel,) = kernel_calls(layer)
        assert kernel.kwargs["kv_len"].args[0].target == torch.ops.aten.amax.default
    assert kernels_in_graph(segmented) == ["tree_attention"]


def test_no_attention_no_change_and_uncached_attention_refused():
    gm = non_matching_graph()
    before = gm.code
    assert not UseKernels()(gm).modified and gm.code == before
    _, captured = captured_tiny()
    with pytest.raises(SpeccError, match="after insert_kv_cache"):
        UseKernels()(captured.graph_module)


def test_kernels_engine_matches_hf_greedy_and_lists_its_kernels(triton_kernels, tmp_path, monkeypatch):
    target = build_tiny_checkpoint("llama", tmp_path / "target", seed=0)
    report = compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "engine",
                                           max_seq_len=32, kernels=True))
    assert report["kernels"] == {"target": ["tree_attention"]}
    assert report["kernel_revisions"] == {"tree_attention": KERNELS["tree_attention"].revision}
    assert [r["pass_name"] for r in report["passes"]][-1] == "use_kernels"
    assert "kernels: tree_attention" in inspect_engine(tmp_path / "engine")

    module = triton_kernels("tree_attention")
    launches, launch = [], module.tree_attention
    monkeypatch.setattr(module, "tree_attention", lambda *args: launches.append(args) or launch(*args))
    engine = load_engine(tmp_path / "engine")
    prompts, new_tokens = [[5, 17, 42], [9], [30, 31, 32, 33, 34, 35, 36]], 8
    got = [engine.generate_ids(ids, new_tokens).token_ids for ids in prompts]
    assert got == hf_greedy(target, prompts, new_tokens)
    assert launches, "the engine's attention must run through the interpreted Triton kernel"


def test_engines_compiled_without_kernels_have_none(tmp_path):
    target = build_tiny_checkpoint("llama", tmp_path / "target", seed=0)
    report = compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "engine",
                                           max_seq_len=32))
    assert "kernels" not in report and "use_kernels" not in [r["pass_name"] for r in report["passes"]]
    assert "kernels:" not in inspect_engine(tmp_path / "engine")
