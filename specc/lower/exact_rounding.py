"""Inductor settings that round reduced precision where eager rounds.

A fused kernel otherwise keeps bfloat16 intermediates in float32, and how it
fuses depends on the graph's outputs, so a method's target graph (with an extra
output) gave other bfloat16 logits than the plain target graph's (a wide random
llama: up to 0.125 apart, 1 to 3 of 10 prompts decoded identically). Inductor's
`emulate_precision_casts` keeps every downcast eager makes. It has no effect in
float32.

torch 2.11 and 2.12's C++ (CPU) backend drops those downcasts inside a kernel
all the same: after storing a value rounded to bfloat16 it caches the unrounded
float32 value as the result of reading it back, and a later upcast in the same
kernel reuses it (torch 2.13 skips that cache under `emulate_precision_casts`;
its source cites pytorch/pytorch#185337). On those versions `exact_rounding`
installs the same guard for CPU graphs and bypasses Inductor's FX graph cache,
which does not know about the guard and could return a kernel generated
without it.
"""

from __future__ import annotations

import torch
from torch.torch_version import TorchVersion

FIXED_IN = (2, 13)


def needs_cpp_rounding_guard() -> bool:
    return TorchVersion(torch.__version__) < FIXED_IN


def install_cpp_rounding_guard() -> None:
    """Skip the C++ kernels' downcast/upcast cache under `emulate_precision_casts`, as torch
    2.13 does. Idempotent; the cache is left alone whenever that option is off."""
    from torch._inductor import config
    from torch._inductor.codegen.cpp import CppKernel

    cache = CppKernel.cache_dtype_convert
    if getattr(cache, "specc_rounding_guard", False):
        return

    def cache_dtype_convert(self, *args, **kwargs):
        if not config.emulate_precision_casts:
            cache(self, *args, **kwargs)

    cache_dtype_convert.specc_rounding_guard = True
    CppKernel.cache_dtype_convert = cache_dtype_convert


def exact_rounding(device: torch.device | str = "cpu") -> dict:
    """Inductor options (for `torch.compile` or an AOTInductor package) under which graphs
    compiled for `device` round bfloat16 and float16 as eager does. Only the C++ kernels of
    a CPU graph need the guard (Triton kernels keep the casts); on CUDA the graph cache
    stays on, so an engine loaded twice compiles once."""
    if torch.device(device).type != "cpu" or not needs_cpp_rounding_guard():
        return {"emulate_precision_casts": True}
    install_cpp_rounding_guard()
    return {"emulate_precision_casts": True, "fx_graph_cache": False}
