"""Compiled graphs round bfloat16 where eager rounds, on every supported torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specc.lower.exact_rounding import exact_rounding, install_cpp_rounding_guard, needs_cpp_rounding_guard
from specc.lower.inductor import weights_device


def gated_mlp_after_norm(x, norm_weight, gate, up):
    """RMSNorm then a SwiGLU product: eager rounds to bfloat16 after every op, and a fused
    kernel that reuses an unrounded float32 value gives other bits."""
    h = x.float()
    h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * norm_weight
    return F.silu(F.linear(h, gate)) * F.linear(h, up)


def bfloat16_inputs():
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=generator).to(torch.bfloat16)
            for shape in ((5, 64), (64,), (128, 64), (128, 64))]


def compiled_against_eager(options) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = bfloat16_inputs()
    torch._dynamo.reset()
    with torch.inference_mode():
        return gated_mlp_after_norm(*inputs), torch.compile(gated_mlp_after_norm, fullgraph=True,
                                                            options=options)(*inputs)


def test_a_fused_bfloat16_kernel_gives_eagers_bits():
    eager, compiled = compiled_against_eager(exact_rounding())
    assert torch.equal(eager, compiled)


def test_the_guard_keeps_eagers_bits_and_installs_once():
    """The guard is what torch 2.13 does itself; installing it there changes nothing."""
    install_cpp_rounding_guard()
    from torch._inductor.codegen.cpp import CppKernel

    guard = CppKernel.cache_dtype_convert
    install_cpp_rounding_guard()
    assert CppKernel.cache_dtype_convert is guard
    eager, compiled = compiled_against_eager({"emulate_precision_casts": True, "fx_graph_cache": False})
    assert torch.equal(eager, compiled)


@pytest.mark.skipif(not needs_cpp_rounding_guard(), reason="this torch rounds as eager without the guard")
def test_old_torch_bypasses_the_graph_cache_for_cpu_graphs_only():
    assert exact_rounding("cpu") == {"emulate_precision_casts": True, "fx_graph_cache": False}
    assert exact_rounding("cuda:0") == {"emulate_precision_casts": True}


def test_compiled_graphs_follow_their_weights_device():
    assert weights_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert weights_device(torch.nn.Identity()) == torch.device("cpu")
    assert weights_device(torch.nn.Linear(2, 2, device="meta")) == torch.device("meta")
